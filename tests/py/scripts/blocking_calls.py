"""Blocking calls while the rank is watched: each must return exactly as it would unwatched.

    blocking_calls.py DIR SECONDS

Creates DIR/ready, then makes each call below for SECONDS: in C with the GIL held (through
ctypes.PyDLL), and in Python. A signal to the rank would cut the C ones short (sleep returns
the seconds left, nanosleep, poll, select, epoll_wait and sem_timedwait fail with EINTR, a
read without SA_RESTART too). Prints one line per call: `NAME rc=R errno=E took=T`."""
import ctypes
import os
import select
import subprocess
import sys
import time

DIR, S = sys.argv[1], float(sys.argv[2])
libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held through each call


class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


def in_c_sleep():
    return libc.sleep(int(S))  # the seconds left unslept: 0 when it slept them all


def in_c_nanosleep():
    rem = timespec(0, 0)
    return libc.nanosleep(ctypes.byref(timespec(int(S), 0)), ctypes.byref(rem))


def in_c_poll():
    return libc.poll(None, 0, int(S * 1000))


def in_c_select():
    return libc.select(0, None, None, None, ctypes.byref(timeval(int(S), 0)))


def in_c_epoll_wait():
    ep = libc.epoll_create1(0x80000)  # EPOLL_CLOEXEC
    events = ctypes.create_string_buffer(12 * 4)
    try:
        return libc.epoll_wait(ep, events, 4, int(S * 1000))
    finally:
        os.close(ep)


def in_c_sem_timedwait():
    sem = ctypes.create_string_buffer(64)  # sem_t is 32 bytes on x86-64
    libc.sem_init(sem, 0, 0)
    deadline = time.clock_gettime(time.CLOCK_REALTIME) + S
    return libc.sem_timedwait(sem, ctypes.byref(timespec(int(deadline), int(deadline % 1 * 1e9))))


def in_c_read():
    r, w = os.pipe()
    writer = subprocess.Popen(["sh", "-c", f"sleep {S}; printf x >&{w}"], pass_fds=[w])
    os.close(w)
    buf = ctypes.create_string_buffer(1)
    try:
        return libc.read(r, buf, 1)
    finally:
        os.close(r)
        writer.wait()


def in_python_sleep():
    time.sleep(S)
    return 0


def in_python_select():
    return len(select.select([], [], [], S)[0])


open(os.path.join(DIR, "ready"), "w").close()
for call in (in_c_sleep, in_c_nanosleep, in_c_poll, in_c_select, in_c_epoll_wait, in_c_sem_timedwait, in_c_read,
             in_python_sleep, in_python_select):
    ctypes.set_errno(0)
    t0 = time.monotonic()
    rc = call()
    took = time.monotonic() - t0
    print(f"{call.__name__} rc={rc} errno={ctypes.get_errno()} took={took:.3f}", flush=True)

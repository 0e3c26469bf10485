"""Stacks asked while the rank's own SIGSEGV handler changes under them.

    faulthandler_churn.py DIR

One thread turns faulthandler on and off as fast as it can, another pushes and pops Python
frames (recursion), and the main thread waits for DIR/release in wait_here(). Once released,
faulthandler is turned on for good and the rank reads address 0: faulthandler's own report
must come out, which it does only if nobody (airhost's stacks reader) swapped its handler away."""
import ctypes
import faulthandler
import os
import sys
import threading
import time

DIR = sys.argv[1]
RELEASE = os.path.join(DIR, "release")
stop = threading.Event()


def churn_handlers():
    while not stop.is_set():
        faulthandler.enable()
        faulthandler.disable()


def churn_frames(depth=0):
    if depth < 30:
        return churn_frames(depth + 1)
    return depth


def frames_forever():
    while not stop.is_set():
        churn_frames()


def wait_here():
    while not os.path.exists(RELEASE):
        time.sleep(0.05)


threads = [threading.Thread(target=churn_handlers), threading.Thread(target=frames_forever)]
for t in threads:
    t.start()
open(os.path.join(DIR, "ready-0"), "w").close()
wait_here()
stop.set()
for t in threads:
    t.join()
faulthandler.enable()
print("reading address 0", flush=True)
ctypes.string_at(0)  # SEGV-HERE

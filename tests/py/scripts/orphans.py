"""Makes orphans that die young, then checks nobody left them zombies (tests/py/test_reaper.py).

    orphans.py [--all] [--then-sleep]

Each rank double-forks 5 grandchildren that exit after 0.5 s: their parent is gone by then,
so they are the host's to reap (as child subreaper, or as PID 1 of a pid namespace). The rank
checks that the host (AIRHOST_HOST_PID) did adopt them, then waits up to 5 s for every one of them to be gone from /proc, not a zombie; with --all (in a
pid namespace of its own, /proc mounted for it) for no zombie at all in /proc. It prints
"no zombie" and goes on, or names them and exits 3. --then-sleep: sleeps afterwards.
"""
import os
import sys
import time

from emit import RANK, say


def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def zombies(pids):
    return [(p, state(p)) for p in pids if state(p) == "Z"]


def orphan():
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        pid = os.fork()
        if pid == 0:
            os.close(r)
            time.sleep(0.5)
            os._exit(0)
        os.write(w, str(pid).encode())
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32))
    os.close(r)
    os.waitpid(middle, 0)
    return pid


pids = [orphan() for _ in range(5)]
host = int(os.environ["AIRHOST_HOST_PID"])
for p in pids:
    with open(f"/proc/{p}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    if ppid != host:
        say(f"rank {RANK}: orphan {p} was adopted by pid {ppid}, not by the host (pid {host})")
        sys.exit(4)
deadline = time.monotonic() + 5
while True:
    left = [(p, state(p)) for p in pids if state(p) is not None]
    if "--all" in sys.argv:
        left += zombies(int(n) for n in os.listdir("/proc") if n.isdigit())
    if not left:
        break
    if time.monotonic() > deadline:
        say(f"rank {RANK}: still there after 5 s: {left}")
        sys.exit(3)
    time.sleep(0.05)
say(f"rank {RANK}: no zombie")
if "--then-sleep" in sys.argv:
    time.sleep(600)

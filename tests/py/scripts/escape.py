"""Each rank starts processes that leave its process group, writes down their pids, says
"rank R ready", then ends as told (tests/py/test_reaper.py).

    escape.py exit|raise|sleep

Started by every rank, pids in <cwd>/escaped/rank-R.<name>:
  session  subprocess.Popen(python -c 'sleep 600', start_new_session=True), holding the rank's
           stdout and stderr
  daemon   a classic daemon: fork, setsid, fork, the middle process exits (so the daemon is an
           orphan at once), stdio on /dev/null
  bare     like session, but with an empty environment: no AIRHOST_RUN_ID to be found by
"""
import os
import subprocess
import sys
import time

from emit import RANK, say

# The child touches its file once its own code runs: its interpreter has set up SIGINT by then
# (a SIGINT that comes during the interpreter's start ends it silently, with no
# KeyboardInterrupt to count).
SLEEP = [sys.executable, "-c", "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(600)"]
OUT = os.path.join(os.getcwd(), "escaped")
os.makedirs(OUT, exist_ok=True)


def sleeper(name, **popen):
    """A `python -c sleep` in a new session, returned once it sleeps in its own code."""
    started = os.path.join(OUT, f".started-{RANK}.{name}")
    proc = subprocess.Popen(SLEEP + [started], start_new_session=True, **popen)
    while not os.path.exists(started):
        if proc.poll() is not None:
            raise RuntimeError(f"the {name} sleeper ended at once ({proc.returncode})")
        time.sleep(0.01)
    return proc


def record(name, pid):
    path = os.path.join(OUT, f"rank-{RANK}.{name}")
    with open(path + ".tmp", "w") as f:
        f.write(str(pid))
    os.replace(path + ".tmp", path)


def daemon():
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(r)
        os.setsid()
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            while True:
                time.sleep(600)
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32))
    os.close(r)
    os.waitpid(middle, 0)
    return pid


record("session", sleeper("session").pid)
record("daemon", daemon())
record("bare", sleeper("bare", env={}).pid)
say(f"rank {RANK} ready")

mode = sys.argv[1]
if mode == "raise":
    raise RuntimeError(f"rank {RANK} fails on purpose")
if mode == "sleep":
    time.sleep(600)

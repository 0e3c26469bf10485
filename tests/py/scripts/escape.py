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

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
OUT = os.path.join(os.getcwd(), "escaped")
os.makedirs(OUT, exist_ok=True)


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


record("session", subprocess.Popen(SLEEP, start_new_session=True).pid)
record("daemon", daemon())
record("bare", subprocess.Popen(SLEEP, start_new_session=True, env={}).pid)
say(f"rank {RANK} ready")

mode = sys.argv[1]
if mode == "raise":
    raise RuntimeError(f"rank {RANK} fails on purpose")
if mode == "sleep":
    time.sleep(600)

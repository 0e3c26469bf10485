"""Rank 1 prints on both streams, then crashes at once (no flush, no cleanup).

    crash_after_print.py segv|osexit|sigkill"""
import ctypes
import os
import signal
import sys
import time

from emit import RANK, say, wait_for_all, warn

how = sys.argv[1]
for i in range(100):
    say(f"rank {RANK} line {i} " + "x" * 100)
warn(f"rank {RANK} last words on stderr")
wait_for_all("printed")  # the others are done printing: the teardown cannot cut them off
if RANK == 1:
    say(f"rank {RANK} last words on stdout")
    if how == "segv":
        ctypes.string_at(0)
    elif how == "osexit":
        os._exit(5)
    elif how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)

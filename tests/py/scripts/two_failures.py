"""Two ranks fail at different times.

    two_failures.py sequence    rank 1 raises at 0.3 s; rank 0 ignores SIGTERM and raises at
                                1.5 s, after the teardown began; rank 2 sleeps
    two_failures.py slow-exit   rank 0 raises at 0.3 s but its interpreter takes 3 s to shut
                                down (an atexit handler); rank 1 raises at 1.0 s, a
                                cascading failure that exits at once
"""
import atexit
import signal
import sys
import time

from emit import RANK, say, wait_for_all

mode = sys.argv[1]
if mode == "sequence" and RANK == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
say(f"rank {RANK} ready")
wait_for_all("ready")
if mode == "sequence":
    if RANK == 1:
        time.sleep(0.3)
        raise ValueError("first failure, on rank 1")
    if RANK == 0:
        time.sleep(1.5)
        raise RuntimeError("second failure, on rank 0")
    time.sleep(60)
elif mode == "slow-exit":
    if RANK == 0:
        atexit.register(time.sleep, 3)
        time.sleep(0.3)
        raise ValueError("first failure, on rank 0")
    if RANK == 1:
        time.sleep(1.0)
        raise RuntimeError("cascading failure, on rank 1")
    time.sleep(60)

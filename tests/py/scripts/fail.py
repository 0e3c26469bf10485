"""One rank fails in the chosen way while the others sleep.

    fail.py --rank 1 --how raise|raise-multiline|exit|osexit|segv|sigkill [--code N]
            [--after SECONDS] [--silent] [--others sleep|ignore-term]

Every rank first prints "rank R ready". Unless --silent, the failing rank prints
"rank R about to fail" on stderr just before failing."""
import argparse
import ctypes
import os
import signal
import sys
import time

from emit import RANK, say, wait_for_all, warn

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1)
p.add_argument("--how", default="raise")
p.add_argument("--code", type=int, default=3)
p.add_argument("--after", type=float, default=0.3)
p.add_argument("--silent", action="store_true")
p.add_argument("--others", default="sleep")
p.add_argument("--sleep", type=float, default=60)
a = p.parse_args()

if RANK != a.rank and a.others == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
say(f"rank {RANK} ready")
wait_for_all("ready")  # every rank is up (and ignores SIGTERM if told to) before one fails

if RANK == a.rank:
    time.sleep(a.after)
    if not a.silent:
        warn(f"rank {RANK} about to fail")
    if a.how == "raise":
        raise ValueError(f"boom on rank {RANK}")  # RAISE-HERE
    if a.how == "raise-multiline":
        raise ValueError(f"boom on rank {RANK}\nsecond line of the message")
    if a.how == "exit":
        sys.exit(a.code)
    if a.how == "osexit":
        os._exit(a.code)
    if a.how == "segv":
        ctypes.string_at(0)  # SEGV-HERE
    if a.how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"unknown --how {a.how}")

time.sleep(a.sleep)
say(f"rank {RANK} woke up")

"""Fails on one rank while TORCHELASTIC_RESTART_COUNT is below --fail-until, then succeeds.

    flaky.py [--fail-until N] [--code C] [--then-sleep S] [--then-sleep-once S]

Every rank prints "rank R attempt A of max M". --then-sleep: once it stops failing, every
rank sleeps S seconds (for timeout and Ctrl-C tests). --then-sleep-once: in attempt 0, sleep
that long instead (for a test to kill a node's airhost meanwhile)."""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--fail-until", type=int, default=1)
p.add_argument("--code", type=int, default=3)
p.add_argument("--then-sleep", type=float, default=0)
p.add_argument("--then-sleep-once", type=float, default=0)
a = p.parse_args()

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} attempt {attempt} of max {os.environ['TORCHELASTIC_MAX_RESTARTS']} "
      f"run {os.environ['TORCHELASTIC_RUN_ID']} port {os.environ['MASTER_PORT']}", flush=True)
if attempt < a.fail_until:
    if rank == 1:
        time.sleep(0.2)
        print(f"rank 1 fails on attempt {attempt}", file=sys.stderr, flush=True)
        sys.exit(a.code)
    time.sleep(30)  # the others are stopped by the teardown
time.sleep(a.then_sleep_once if attempt == 0 and a.then_sleep_once else a.then_sleep)

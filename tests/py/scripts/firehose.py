"""Every rank writes numbered lines flat out, for `seconds` (default: until stopped), then
exits; rank `fail_rank` (if given) raises after `fail_after` seconds.

    firehose.py [SECONDS] [FAIL_RANK FAIL_AFTER]"""
import os
import sys
import time

rank = int(os.environ["RANK"])
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
fail_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
fail_after = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
start = time.monotonic()
i = 0
pad = "x" * 200
while time.monotonic() - start < seconds:
    if rank == fail_rank and time.monotonic() - start > fail_after:
        raise RuntimeError(f"rank {rank} fails on purpose after {i} lines")
    sys.stdout.write(f"{rank}:{i}:{pad}\n")
    i += 1
    if i % 100 == 0:
        sys.stdout.flush()

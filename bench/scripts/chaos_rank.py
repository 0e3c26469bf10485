"""One light rank of bench/chaos.py (no torch: what is under test is the hosts and their link).

    chaos_rank.py DIR SECONDS

Stamps DIR/up-<GROUP_RANK>-<attempt>-<pid> once started, then prints "line N" (N from 0) every 20 ms
for SECONDS and exits 0; exits 3 at once when DIR/crash-<GROUP_RANK> appears (the campaign's
"a rank crashes" fault). Every line is flushed, so a line missing from the rank's log is a line
the host lost."""
import os
import sys
import time
from pathlib import Path

d, seconds = Path(sys.argv[1]), float(sys.argv[2])
node = os.environ["GROUP_RANK"]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # airhost sets it, as torchrun does
stamp = d / f"up-{node}-{attempt}-{os.getpid()}"
stamp.with_suffix(".tmp").write_text("")
os.replace(stamp.with_suffix(".tmp"), stamp)
crash = d / f"crash-{node}"
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    if crash.exists():
        print(f"crashing at line {n}", flush=True)
        sys.exit(3)
    print(f"line {n}", flush=True)
    n += 1
    time.sleep(0.02)

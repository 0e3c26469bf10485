"""Every rank prints "rank R ready", then sleeps (for timeouts and signals to the host).

    sleeper.py [--ignore-int] [--ignore-term] [--sleep SECONDS] [--grandchild]

--grandchild: first start `sleep 300` (a child that never looks at its parent)."""
import argparse
import signal
import subprocess
import time

from emit import RANK, say

p = argparse.ArgumentParser()
p.add_argument("--ignore-int", action="store_true")
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--ignore-term-on", type=int, default=None, help="ignore SIGTERM on this rank only")
p.add_argument("--sleep", type=float, default=60)
p.add_argument("--grandchild", action="store_true")
a = p.parse_args()

if a.grandchild:
    subprocess.Popen(["sleep", "300"])

if a.ignore_int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if a.ignore_term or a.ignore_term_on == RANK:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
say(f"rank {RANK} ready")
time.sleep(a.sleep)
say(f"rank {RANK} woke up")

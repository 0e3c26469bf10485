"""A caller whose stdout nobody reads (test_stalled_reader.py): it submits a run whose two
ranks print flat out for SECONDS, samples its own memory meanwhile, and writes what it saw to
REPORT once its output is read again. `python unread_caller.py SECONDS REPORT`"""
import json
import sys
import threading
import time

from airhost import distributed


def flood(seconds):
    import os
    import sys
    import time

    rank, start, i = os.environ["RANK"], time.monotonic(), 0
    while time.monotonic() - start < seconds:
        sys.stdout.write(f"{rank}:{i}:" + "x" * 200 + "\n")
        i += 1
    return i


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


seconds, report = float(sys.argv[1]), sys.argv[2]
samples = []
stop = threading.Event()


def sample():
    while not stop.is_set():
        samples.append(rss_mib())
        time.sleep(0.1)


threading.Thread(target=sample, daemon=True).start()
time.sleep(0.3)
baseline = rss_mib()
future = distributed(num_accelerators=2, tracking=False)(flood).submit(seconds)
lines = future.result(timeout=300)  # the run's output blocks in sys.stdout until it is read
stop.set()
with open(report, "w") as f:
    json.dump({"baseline": baseline, "peak": max(samples), "lines": lines}, f)

"""Caller scripts of test_api_live_output.py: `python live_output.py SCENARIO`."""
import sys
import time

import _helpers
from airhost import distributed

STEPS, SECONDS = 15, 3.0


def bar_and_prompt():
    """Rank 0 leaves a prompt open on stdout while every rank draws a `\\r` bar on stderr."""
    import os

    rank = int(os.environ["RANK"])
    if rank == 0:
        sys.stdout.write("Password: ")
        sys.stdout.flush()
    for i in range(STEPS + 1):
        sys.stderr.write(f"\rrank {rank} step {i:02d}/{STEPS}")
        sys.stderr.flush()
        if i < STEPS:
            time.sleep(SECONDS / STEPS)
    sys.stderr.write("\n")
    if rank == 0:
        print("ok")
    return rank


class Recorder:
    """Stands in for sys.stdout or sys.stderr: notes when each write came, and what."""

    def __init__(self):
        self.writes = []
        self.t0 = time.monotonic()

    def write(self, text):
        self.writes.append((time.monotonic() - self.t0, text))
        return len(text)

    def flush(self):
        pass


def scenario_bar():
    out, err = Recorder(), Recorder()
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        results = distributed(num_accelerators=2, tracking=False)(bar_and_prompt).distributed()
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    _helpers.report({"results": results, "out": out.writes, "err": err.writes})


def told_size():
    import os

    return [os.environ.get(k) for k in ("COLUMNS", "LINES", "TQDM_NCOLS")] + [sys.stdout.isatty()]


def scenario_size():
    """Run with a terminal as stdout: what the ranks are told of it."""
    _helpers.report(distributed(num_accelerators=2, tracking=False)(told_size).distributed())


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

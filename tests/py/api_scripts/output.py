"""Caller scripts of test_api_output.py: `python output.py SCENARIO`."""
import io
import os
import sys
import time

import _helpers
from airhost import distributed


def chatty():
    rank = os.environ["RANK"]
    print(f"out line 1 of {rank}")
    print(f"out line 2 of {rank}", flush=True)
    print(f"err line of {rank}", file=sys.stderr, flush=True)
    sys.stdout.write(f"unterminated {rank}")  # no newline: still a line of its own
    return int(rank)


def scenario_capture(prefix="1"):
    """Rank output lands in whatever sys.stdout/sys.stderr are at call time."""
    out, err = io.StringIO(), io.StringIO()
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        results = distributed(num_accelerators=2, tracking=False, prefix=prefix == "1")(chatty).distributed()
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    _helpers.report({"results": results, "out": out.getvalue(), "err": err.getvalue()})


def sleeps_after_start():
    print("started", flush=True)
    time.sleep(60)
    return 0


def scenario_sigint():
    """The test sends SIGINT once every rank printed 'started'."""
    fn = distributed(num_accelerators=2, tracking=False, grace=10)(sleeps_after_start)
    t0 = time.monotonic()
    try:
        fn.distributed()
        out = {"raised": None}
    except KeyboardInterrupt as e:
        out = {"raised": "KeyboardInterrupt", "message": str(e)}
    except BaseException as e:
        out = {"raised": type(e).__name__, "message": str(e)}
    out["seconds"] = time.monotonic() - t0
    out["interrupted_at"] = time.time()
    out["ranks_left"] = _helpers.rank_processes(os.environ["AIRHOST_RUNS_DIR"])  # after teardown?
    _helpers.report(out)


def sleeps_after_starting_a_child():
    import subprocess

    subprocess.Popen(["sleep", "300"])  # never looks at its parent
    return sleeps_after_start()


def scenario_sleep():
    """The test SIGKILLs this caller once every rank printed 'started'."""
    distributed(num_accelerators=2, tracking=False)(sleeps_after_starting_a_child).distributed()


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

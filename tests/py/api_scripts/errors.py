"""Caller scripts of test_api_errors.py: `python errors.py SCENARIO`. Each scenario runs a
failing function and reports what the caller got (_helpers.describe_exception)."""
import os
import signal
import sys
import time

import _helpers
from airhost import distributed


class TrainingDiverged(Exception):
    """A user's own exception class, defined in __main__, carrying extra state."""

    def __init__(self, message, loss=None, step=None):
        super().__init__(message)
        self.loss = loss
        self.step = step


class Unrebuildable(Exception):
    """An exception whose __init__ does not take its own args: Python cannot unpickle it."""

    def __init__(self, loss, step):
        super().__init__(f"loss {loss} at step {step}")


def fails_on_rank_1():
    if os.environ["RANK"] == "1":
        raise ValueError("bad learning rate on rank 1")  # RAISE-VALUE-ERROR
    return "rank 0 is fine"


def diverges():
    if os.environ["RANK"] == "1":
        raise TrainingDiverged("the loss diverged", loss=float("inf"), step=42)  # RAISE-CUSTOM
    return 0


def unrebuildable():
    if os.environ["RANK"] == "0":
        raise Unrebuildable(float("nan"), 7)  # RAISE-UNREBUILDABLE
    return 0


def killed():
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)  # rank 0 waits: the run must stop it
    return 0


def sleeps():
    print("sleeping", flush=True)
    time.sleep(120)
    return 0


def run(fn, **options):
    options.setdefault("num_accelerators", 2)
    options.setdefault("tracking", False)
    t0 = time.monotonic()
    try:
        value = distributed(**options)(fn).distributed()
        out = {"value": value}
    except BaseException as e:
        out = _helpers.describe_exception(e)
        cause = e.__cause__
        if isinstance(cause, TrainingDiverged):
            out["cause_is_main_class"] = True
            out["cause_state"] = [cause.loss, cause.step]
        else:
            out["cause_is_main_class"] = False
    out["seconds"] = time.monotonic() - t0
    # Nothing of the run may be left when the call has returned or raised.
    out["ranks_left"] = _helpers.rank_processes(os.environ["AIRHOST_RUNS_DIR"])
    _helpers.report(out)


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "value_error":
        run(fails_on_rank_1)
    elif which == "custom_error":
        run(diverges)
    elif which == "unrebuildable":
        run(unrebuildable)
    elif which == "sigkill":
        run(killed)
    elif which == "timeout":
        run(sleeps, timeout=2)

"""Caller scripts of test_api_submit.py: `python submit.py SCENARIO TMPDIR`."""
import concurrent.futures
import os
import sys
import time

import _helpers
from airhost import distributed


def hold(tag, seconds, marks):
    """Runs `seconds`, telling the caller it started by creating marks/<tag>."""
    start = time.time()
    open(os.path.join(marks, tag), "w").close()
    time.sleep(seconds)
    return {"tag": tag, "start": start, "end": time.time(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid()}


def wait_marks(marks, tags, timeout=60):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(marks, t)) for t in tags):
        if time.monotonic() > deadline:
            raise SystemExit(f"ranks {tags} did not start within {timeout} s")
        time.sleep(0.05)


def marks_dir(tmp):
    d = os.path.join(tmp, "marks")
    os.makedirs(d, exist_ok=True)
    return d


def scenario_concurrent(tmp):
    marks = marks_dir(tmp)
    fn = distributed(num_accelerators=1, tracking=False)(hold)
    t0 = time.monotonic()
    a = fn.submit("a", 2.5, marks)
    submit_seconds = time.monotonic() - t0
    b = fn.submit("b", 2.5, marks)
    out = {
        "is_future": [isinstance(f, concurrent.futures.Future) for f in (a, b)],
        "submit_seconds": submit_seconds,
        "done_right_after_submit": a.done(),
    }
    done, pending = concurrent.futures.wait([a, b], timeout=60)
    out["pending"] = len(pending)
    out["results"] = [a.result(), b.result()]
    _helpers.report(out)


def fails():
    raise ValueError("submitted and failed")


def scenario_failure(tmp):
    future = distributed(num_accelerators=2, tracking=False)(fails).submit()
    exc = future.exception(timeout=60)
    _helpers.report(_helpers.describe_exception(exc) if exc else None)


def scenario_gpu_leases(tmp):
    """With the FAKE NVML of two GPUs: two 1-GPU runs hold both; a third cannot start at once."""
    marks = marks_dir(tmp)
    one_gpu = distributed(num_accelerators=1, tracking=False, wait_for_accelerators=0)(hold)
    a = one_gpu.submit("a", 4, marks)
    b = one_gpu.submit("b", 4, marks)
    wait_marks(marks, ["a", "b"])
    out = {}
    try:
        one_gpu.distributed("c", 0, marks)
        out["no_wait"] = None
    except Exception as e:
        out["no_wait"] = {"type": type(e).__name__, "message": str(e), "while_held": not (a.done() or b.done())}
    # Queued: waits until a GPU is free, then runs on it.
    queued = distributed(num_accelerators=1, tracking=False, wait_for_accelerators=None)(hold)
    out["queued"] = queued.distributed("d", 0, marks)
    out["held"] = [a.result(timeout=60), b.result(timeout=60)]
    _helpers.report(out)


def scenario_queued_submit(tmp):
    """With the FAKE NVML of two GPUs held by two runs, .submit() of a third that must wait."""
    marks = marks_dir(tmp)
    one_gpu = distributed(num_accelerators=1, tracking=False)(hold)
    a = one_gpu.submit("a", 4, marks)
    b = one_gpu.submit("b", 4, marks)
    wait_marks(marks, ["a", "b"])
    t0 = time.monotonic()
    c = one_gpu.submit("c", 0, marks)
    submit_seconds = time.monotonic() - t0
    out = {"submit_seconds": submit_seconds, "held": [a.result(timeout=60), b.result(timeout=60)],
           "queued": c.result(timeout=60)}
    _helpers.report(out)


def scenario_cancel_while_waiting(tmp):
    """With the FAKE NVML of two GPUs held by two runs: a third submitted run waits for a GPU;
    cancel() and stop() end it at once with CancelledError, and no rank of it ever starts."""
    marks = marks_dir(tmp)
    one_gpu = distributed(num_accelerators=1, tracking=False)(hold)
    a = one_gpu.submit("a", 6, marks)
    b = one_gpu.submit("b", 6, marks)
    wait_marks(marks, ["a", "b"])
    c = one_gpu.submit("c", 0, marks)
    d = one_gpu.submit("d", 0, marks)
    time.sleep(1.0)  # both wait for a GPU now
    out = {"pending_while_waiting": [not c.running() and not c.done(), not d.running() and not d.done()]}
    t0 = time.monotonic()
    out["cancel_returned"] = c.cancel()
    d.stop()
    for name, f in (("c", c), ("d", d)):
        try:
            f.result(timeout=5)
            out[name] = "result"
        except concurrent.futures.CancelledError:
            out[name] = "CancelledError"
        except BaseException as e:
            out[name] = type(e).__name__
    out["cancel_seconds"] = time.monotonic() - t0
    out["held"] = [a.result(timeout=60)[0]["tag"], b.result(timeout=60)[0]["tag"]]
    time.sleep(1.0)  # a GPU is free now: a cancelled run must not take it and start
    out["started"] = sorted(os.listdir(marks))
    _helpers.report(out)


def scenario_stop_running(tmp):
    """stop() on a running future tears the run down and ends the future with CancelledError."""
    marks = marks_dir(tmp)
    f = distributed(num_accelerators=2, tracking=False)(hold).submit("r", 60, marks)
    wait_marks(marks, ["r"])
    t0 = time.monotonic()
    f.stop()
    try:
        f.result(timeout=30)
        out = {"ended": "result"}
    except concurrent.futures.CancelledError as e:
        out = {"ended": "CancelledError", "message": str(e)}
    except BaseException as e:
        out = {"ended": type(e).__name__, "message": str(e)}
    out["seconds"] = time.monotonic() - t0
    _helpers.report(out)


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

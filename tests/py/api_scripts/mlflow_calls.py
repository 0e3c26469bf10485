"""Caller scripts of test_mlflow.py: `python mlflow_calls.py SCENARIO`. The test points
MLFLOW_TRACKING_URI at a sqlite file of its own and reads the runs back afterwards."""
import os
import sys
import time

import _helpers
from airhost import distributed


def log_one():
    import mlflow

    rank = int(os.environ["RANK"])
    mlflow.log_metric(f"rank{rank}_metric", rank + 0.5)
    return rank


def scenario_basic():
    results = distributed(num_accelerators=2)(log_one).distributed()
    _helpers.report({"results": results})


def scenario_nested():
    import mlflow

    with mlflow.start_run(run_name="parent-run") as parent:
        results = distributed(num_accelerators=2)(log_one).distributed()
        active = mlflow.active_run()
        out = {"results": results, "parent": parent.info.run_id,
               "active_after": active.info.run_id if active else None}
    _helpers.report(out)


def log_many(steps):
    import mlflow

    rank = int(os.environ["RANK"])
    for step in range(steps):
        mlflow.log_metric(f"loss_rank{rank}", 1.0 / (step + 1), step=step)
    return rank


def scenario_many(ranks, steps):
    t0 = time.monotonic()
    results = distributed(num_accelerators=int(ranks))(log_many).distributed(int(steps))
    _helpers.report({"results": results, "seconds": time.monotonic() - t0})


def busy(seconds):
    # Rank 0 computes for `seconds`, rank 1 sleeps as long: the host's samples tell them apart.
    rank, until = int(os.environ["RANK"]), time.monotonic() + seconds
    while time.monotonic() < until:
        if rank == 0:
            sum(range(10000))
        else:
            time.sleep(0.2)
    return rank


def scenario_busy(seconds):
    results = distributed(num_accelerators=2)(busy).distributed(float(seconds))
    _helpers.report({"results": results})


def fails():
    if os.environ["RANK"] == "1":
        raise ValueError("diverged")
    return 0


def scenario_fails():
    try:
        distributed(num_accelerators=2)(fails).distributed()
        _helpers.report(None)
    except Exception as e:
        _helpers.report(_helpers.describe_exception(e))


def sleeps():
    print("started", flush=True)
    time.sleep(60)


def scenario_sigint():
    try:
        distributed(num_accelerators=2)(sleeps).distributed()
        _helpers.report({"raised": None})
    except KeyboardInterrupt:
        _helpers.report({"raised": "KeyboardInterrupt", "at": time.time()})


def scenario_tracked_quiet():
    """Tracked, but the ranks never touch MLflow themselves."""
    results = distributed(num_accelerators=2)(log_nothing).distributed()
    _helpers.report({"results": results})


def scenario_untracked():
    results = distributed(num_accelerators=2, tracking=False)(log_nothing).distributed()
    _helpers.report({"results": results})


def log_nothing():
    return int(os.environ["RANK"])


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

"""Caller scripts of test_api_fanout.py: `python fanout.py SCENARIO [ARGS]`.

Everything below is defined in this script's __main__, as in a user's train.py, so
cloudpickle sends it by value. Each scenario reports its outcome with _helpers.report().
"""
import os
import sys
import threading
import time
import warnings

import _helpers
from airhost import distributed

# ---- unpicklable captures ---------------------------------------------------------------------


def scenario_lock_closure():
    training_lock = threading.Lock()

    @distributed(num_accelerators=2, tracking=False)
    def uses_lock():
        with training_lock:
            return 1

    out = {}
    for how in ("distributed", "submit"):
        try:
            getattr(uses_lock, how)()
            out[how] = None
        except Exception as e:
            out[how] = {"type": type(e).__name__, "message": str(e)}
    _helpers.report(out)


GLOBAL_LOCK = threading.Lock()


def uses_global_lock():
    with GLOBAL_LOCK:
        return 1


def scenario_lock_global():
    try:
        distributed(num_accelerators=2, tracking=False)(uses_global_lock).distributed()
        _helpers.report(None)
    except Exception as e:
        _helpers.report({"type": type(e).__name__, "message": str(e)})


# ---- a 1 GiB capture ----------------------------------------------------------------------------------


def scenario_big_bytes():
    blob = b"\x01" * (1 << 30)

    @distributed(num_accelerators=2, tracking=False)
    def length():
        return len(blob), blob[:1] + blob[-1:]

    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            results = length.distributed()
            out = {"results": [[n, list(ends)] for n, ends in results]}
        except Exception as e:
            out = {"error": {"type": type(e).__name__, "message": str(e)}}
    out["seconds"] = time.monotonic() - t0
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    _helpers.report(out)


# ---- the caller's environment ---------------------------------------------------------------


def scenario_sys_path(tmp):
    # A module the ranks can only find through the caller's sys.path, added at run time.
    mod_dir = os.path.join(tmp, "private_modules")
    os.makedirs(mod_dir, exist_ok=True)
    with open(os.path.join(mod_dir, "airhost_probe_mod.py"), "w") as f:
        f.write("VALUE = 'from the caller sys.path'\n\ndef where():\n    import os\n    return os.environ['RANK']\n")
    sys.path.append(mod_dir)
    import airhost_probe_mod  # the function below refers to it by name: pickled by reference

    @distributed(num_accelerators=2, tracking=False)
    def probe():
        import airhost_probe_mod as again

        return {"value": again.VALUE, "where": airhost_probe_mod.where(), "in_path": mod_dir in sys.path,
                "file": again.__file__}

    _helpers.report({"results": probe.distributed(), "mod_dir": mod_dir})


def scenario_executable():
    @distributed(num_accelerators=2, tracking=False)
    def which():
        return {"executable": sys.executable, "prefix": sys.prefix, "version": list(sys.version_info[:3])}

    _helpers.report({"results": which.distributed(), "executable": sys.executable, "prefix": sys.prefix,
                     "version": list(sys.version_info[:3])})


# ---- results ----------------------------------------------------------------------------------------------


class Point:
    def __init__(self, x):
        self.x = x

    def norm(self):
        return abs(self.x)


def scenario_results_order():
    @distributed(num_accelerators=3, tracking=False)
    def by_rank(base):
        rank = int(os.environ["RANK"])
        time.sleep(0.6 * (2 - rank))  # rank 2 finishes first, rank 0 last
        return {"rank": rank, "value": base + rank, "finished": time.time()}

    results = by_rank.distributed(100)
    _helpers.report({"results": results})


def scenario_main_class_result():
    @distributed(num_accelerators=2, tracking=False)
    def make_points():
        return Point(-int(os.environ["RANK"]) - 1)

    points = make_points.distributed()
    _helpers.report({"types": [type(p).__name__ for p in points], "isinstance": [isinstance(p, Point) for p in points],
                     "norms": [p.norm() for p in points]})


def scenario_none_result():
    @distributed(num_accelerators=2, tracking=False)
    def nothing():
        pass

    _helpers.report({"results": nothing.distributed()})


def scenario_unpicklable_result(kind):
    @distributed(num_accelerators=2, tracking=False)
    def bad_result():
        if os.environ["RANK"] == "1":
            if kind == "generator":
                return (i for i in range(3))
            return threading.Lock()
        return "fine"

    try:
        bad_result.distributed()
        _helpers.report(None)
    except BaseException as e:
        _helpers.report(_helpers.describe_exception(e))


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

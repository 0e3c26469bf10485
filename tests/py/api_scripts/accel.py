"""Caller script of test_api_accelerators.py and test_api_signature.py:
`python accel.py '{"num_accelerators": 3}'` runs a function with those @distributed options
and reports what each rank saw, or the exception of the call. The test chooses the node
through the environment (this node, or the fake NVML)."""
import json
import os
import sys
import warnings

import _helpers
from airhost import distributed


def what_i_see():
    return {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
                                           "CUDA_DEVICE_ORDER")}


if __name__ == "__main__":
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    options.setdefault("tracking", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = distributed(**options)(what_i_see)
            out = {"results": fn.distributed()}
        except Exception as e:
            out = {"error": {"type": type(e).__name__, "message": str(e)}}
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    out["run_dirs"] = len(os.listdir(os.environ["AIRHOST_RUNS_DIR"])) if os.path.isdir(
        os.environ["AIRHOST_RUNS_DIR"]) else 0
    _helpers.report(out)

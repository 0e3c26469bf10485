"""A notebook's use of Ray through airhost: start Ray on this node, run a task and a small
Ray Data pipeline, call ray_init again as a re-run cell would, then end WITHOUT
ray.shutdown(): the instance must still go away at interpreter exit (tests/py/test_ray.py)."""
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api_scripts"))
import _helpers  # noqa: E402

import airhost  # noqa: E402
from airhost import _accelerators, _ray  # noqa: E402

context = airhost.ray_init(include_dashboard=False)  # a keyword for ray.init itself

import ray  # noqa: E402


@ray.remote
def square(x):
    return x * x


squares = ray.get([square.remote(i) for i in range(8)])
rows = ray.data.range(100).map(lambda row: {"id": row["id"], "double": 2 * row["id"]}).take_all()

with warnings.catch_warnings(record=True) as quiet:
    warnings.simplefilter("always")
    again = airhost.ray_init()  # a notebook cell run twice
with warnings.catch_warnings(record=True) as noisy:
    warnings.simplefilter("always")
    overridden = airhost.ray_init(num_cpus=1, include_dashboard=True)

_helpers.report({
    "pid": os.getpid(),
    "session_dir": context.address_info["session_dir"],
    "gcs_address": context.address_info["gcs_address"],
    "again_gcs_address": again.address_info["gcs_address"],
    "overridden_gcs_address": overridden.address_info["gcs_address"],
    "quiet_warnings": [str(w.message) for w in quiet],
    "noisy_warnings": [f"{w.category.__name__}: {w.message}" for w in noisy],
    "resources": ray.cluster_resources(),
    "detected_gpus": len(_accelerators.detect().gpus),
    "usable_cpus": _ray.usable_cpus(),
    "squares": squares,
    "rows": len(rows),
    "doubles_ok": all(r["double"] == 2 * r["id"] for r in rows),
    "ids": sorted(r["id"] for r in rows) == list(range(100)),
})

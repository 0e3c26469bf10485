"""Joins the Ray instance another process started (hold.py) through airhost.ray_init, the two
ways a user points at a running Ray: address="auto", then RAY_ADDRESS. Reports what it saw
(tests/py/test_ray.py)."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api_scripts"))
import _helpers  # noqa: E402

import airhost  # noqa: E402

import ray  # noqa: E402


@ray.remote
def square(x):
    return x * x


def use(context) -> dict:
    return {"gcs_address": context.address_info["gcs_address"], "resources": ray.cluster_resources(),
            "square": ray.get(square.remote(7))}


auto = use(airhost.ray_init(address="auto"))
ray.shutdown()  # of a joined instance: disconnects this driver only
os.environ["RAY_ADDRESS"] = auto["gcs_address"]
from_env = use(airhost.ray_init())
ray.shutdown()
try:  # resources belong to the instance being joined
    airhost.ray_init(address="auto", num_cpus=4)
    refused = None
except ValueError as e:
    refused = str(e)
finally:
    ray.shutdown()
_helpers.report({"pid": os.getpid(), "auto": auto, "env": from_env, "refused": refused})

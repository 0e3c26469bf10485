"""Starts Ray through airhost.ray_init, reports its address and resources, then keeps it up
until the file named by argv[1] exists, so that another process can join it
(tests/py/test_ray.py). Exits without ray.shutdown(): the instance it started ends at exit."""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api_scripts"))
import _helpers  # noqa: E402

import airhost  # noqa: E402

release = Path(sys.argv[1])
context = airhost.ray_init(include_dashboard=False)

import ray  # noqa: E402

_helpers.report({"pid": os.getpid(), "gcs_address": context.address_info["gcs_address"],
                 "resources": ray.cluster_resources()})
deadline = time.monotonic() + 120
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print("released" if release.exists() else "gave up waiting", flush=True)

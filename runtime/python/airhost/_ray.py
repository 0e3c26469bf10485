"""`airhost.ray_init()`: Ray on this node, sized by what airhost sees of it.

Ray is imported inside the function only: `import airhost` must stay as light as it is
(no Ray, no torch), and a node without Ray must still run everything else.
"""
from __future__ import annotations

import atexit
import math
import os
import tempfile
import warnings
from typing import Any, Optional

_RAY_MISSING = "airhost.ray_init needs Ray: pip install 'ray[default]'"
_shutdown_registered = False


def ray_init(
    address: Optional[str] = None,
    *,
    num_cpus: Optional[int] = None,
    num_gpus: Optional[int] = None,
    **kwargs: Any,
):
    """Starts a Ray instance on this node, or joins the one already running, and returns
    `ray.init`'s context, so Ray Data and Ray Train code runs from a notebook.

    - Already connected (`ray.is_initialized()`): the existing context comes back; settings
      given here cannot apply to it, so they are named in a RuntimeWarning.
    - `address` ("auto", "host:port", "ray://..."), `RAY_ADDRESS`, or a cluster that
      `ray start` left on this node: that instance is joined as it is. Its resources are the
      ones it was started with, so num_cpus/num_gpus are only passed on when given here (Ray
      then refuses them with its own message).
    - Otherwise a new instance starts with `num_gpus` = the GPUs airhost detects (NVML,
      `CUDA_VISIBLE_DEVICES` honoured: the same GPUs `@distributed` would use) and
      `num_cpus` = the CPUs this process may run on (affinity and cgroup quota), so Ray
      never schedules more work than the container can run. Its files go to
      `<tmp>/ray-<uid>` unless `_temp_dir` or `RAY_TMPDIR` says otherwise: Ray's shared
      `/tmp/ray` belongs to whichever user created it first (ray-project/ray#4593), and the
      path must stay short enough for Ray's Unix sockets. It is shut down at interpreter
      exit; an instance that was joined is left running for its other drivers.

    Every other keyword goes to `ray.init` unchanged (include_dashboard, runtime_env, ...).
    """
    global _shutdown_registered
    try:
        import ray
    except ImportError as e:
        raise ImportError(_RAY_MISSING) from e

    if ray.is_initialized():
        ignored = [name for name, value in (("address", address), ("num_cpus", num_cpus), ("num_gpus", num_gpus))
                   if value is not None] + sorted(kwargs)
        if ignored:
            warnings.warn(
                "Ray is already initialized in this process: airhost.ray_init returns its context and "
                f"ignores {', '.join(ignored)}; call ray.shutdown() first to start Ray with other settings",
                RuntimeWarning,
                stacklevel=2,
            )
        return ray.init(ignore_reinit_error=True)

    if _existing_instance(address, kwargs.get("_temp_dir")):
        if num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        if num_gpus is not None:
            kwargs["num_gpus"] = num_gpus
        return ray.init(address=address, **kwargs)

    if num_gpus is None:
        from . import _accelerators

        num_gpus = len(_accelerators.detect().gpus)
    if num_cpus is None:
        num_cpus = usable_cpus()
    if "_temp_dir" not in kwargs and not os.environ.get("RAY_TMPDIR"):
        kwargs["_temp_dir"] = os.path.join(tempfile.gettempdir(), f"ray-{os.getuid()}")
    context = ray.init(address=address, num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
    if not _shutdown_registered:  # once, however many times Ray is started and stopped here
        atexit.register(ray.shutdown)
        _shutdown_registered = True
    return context


def _existing_instance(address: Optional[str], temp_dir: Optional[str]) -> bool:
    """Whether `ray.init(address)` would connect rather than start: decided the way Ray
    decides it, since passing num_cpus to an instance that is joined is an error."""
    if address is not None:
        return address != "local"
    if os.environ.get("RAY_ADDRESS"):
        return True
    try:  # a cluster `ray start` recorded in Ray's temp dir (not public API: best effort)
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(None, temp_dir) is not None
    except Exception:
        return False


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota. A
    container limited to 4 CPUs on a 64-core host sees 64 in os.cpu_count()."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, math.floor(quota)))
    return max(1, count)


def _cgroup_cpu_quota() -> Optional[float]:
    """The CPU limit of this process's cgroup in CPUs (v2 cpu.max, else v1 cfs quota and
    period), None when unlimited or unknown."""
    v2 = ["/sys/fs/cgroup/cpu.max"]
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):  # the unified (v2) hierarchy
                    v2.insert(0, os.path.join("/sys/fs/cgroup", line[3:].strip().lstrip("/"), "cpu.max"))
    except OSError:
        pass
    for path in v2:
        try:
            with open(path) as f:
                quota, period = f.read().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            continue
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None

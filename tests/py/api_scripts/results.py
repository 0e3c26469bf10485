"""Caller scripts of test_results.py: `python results.py SCENARIO [ARGS]`.

Large return values come back through shared memory (or an unnamed file in the run
directory), by descriptor, never through a pipe. Each scenario reports what the caller saw
with _helpers.report().
"""
import gc
import hashlib
import os
import sys
import time
from pathlib import Path

import _helpers
from airhost import DistributedError, distributed

MIB = 1 << 20


def shm_entries():
    """Entries of /dev/shm that airhost could have made (others' come and go on a shared machine:
    torch.multiprocessing's torch_PID_* of other tests, say)."""
    return sorted(name for name in os.listdir("/dev/shm") if "airhost" in name)


def result_fds():
    """This process's descriptors that are results: memfds, or files of a run's results/."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "airhost-result" in target or "/results/" in target:
            found.append(target)
    return found


def result_mappings():
    """Lines of /proc/self/maps that map a result (memfd or file), deduplicated by name."""
    with open("/proc/self/maps") as f:
        return sorted({line.split(None, 5)[-1].strip() for line in f
                       if "airhost-result" in line or "/results/" in line})


def maps_holding(address):
    """The name of the mapping that holds `address`."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) == 6 else ""
    return None


def leftovers():
    """Files left in the runs' results/ folders (there must be none)."""
    left = []
    for run in _helpers.run_dirs(Path(os.environ["AIRHOST_RUNS_DIR"]).parent):
        results = run / "results"
        if results.exists():
            left += [str(p) for p in results.iterdir()]
    return left


# ---- 4 ranks x (256 MiB tensor, 64 MiB array, 16 MiB bytes) ---------------------------


def big_values():
    import numpy as np
    import torch

    rank = int(os.environ["RANK"])
    tensor = torch.arange(64 * MIB, dtype=torch.int32) * (rank + 1) + rank  # 256 MiB
    array = np.arange(8 * MIB, dtype=np.float64) * 0.5 + rank  # 64 MiB
    blob = hashlib.sha256(str(rank).encode()).digest() * (MIB // 2)  # 16 MiB
    return {
        "rank": rank,
        "tensor": tensor,
        "view": tensor[1000:1010],  # a view of the same storage: must stay one
        "array": array,
        "bytes": blob,
        "small": b"s" * 100,
        "sums": [int(tensor.sum(dtype=torch.int64)), float(array.sum()), hashlib.sha256(blob).hexdigest()],
    }


def scenario_big():
    import numpy as np
    import torch

    shm_before = shm_entries()
    t0 = time.monotonic()
    results = distributed(num_accelerators=4, tracking=False)(big_values).distributed()
    seconds = time.monotonic() - t0
    out = {"seconds": seconds, "ranks": [], "fds_while_held": result_fds(), "maps_while_held": result_mappings()}
    for rank, r in enumerate(results):
        t, a = r["tensor"], r["array"]
        tensor_sum = int(t.sum(dtype=torch.int64))
        array_sum = float(a.sum())
        digest = hashlib.sha256(r["bytes"]).hexdigest()
        t[0] += 1  # writable; copy-on-write, so no one else sees it
        out["ranks"].append({
            "rank": r["rank"],
            "tensor": [str(t.dtype), list(t.shape), t.is_contiguous()],
            "tensor_ok": tensor_sum == r["sums"][0],
            "tensor_values": [int(t[1]), int(t[-1])],
            "array": [str(a.dtype), list(a.shape), bool(a.flags.writeable)],
            "array_ok": bool(array_sum == r["sums"][1] and a[3] == 1.5 + rank),
            "bytes_ok": digest == r["sums"][2] and len(r["bytes"]) == 16 * MIB,
            "small": r["small"] == b"s" * 100,
            "view_shares": r["view"].untyped_storage().data_ptr() == t.untyped_storage().data_ptr(),
            "view_values": r["view"].tolist() == [(1000 + i) * (rank + 1) + rank for i in range(10)],
            "tensor_mapped_from": maps_holding(t.data_ptr()),
            "array_mapped_from": maps_holding(a.ctypes.data),
        })
    del results, r, t, a
    gc.collect()
    out["maps_after"] = result_mappings()
    out["fds_after"] = result_fds()
    out["shm_added"] = sorted(set(shm_entries()) - set(shm_before))
    out["left_in_run_dirs"] = leftovers()
    _helpers.report(out)


# ---- not enough shared memory -----------------------------------------------------------


def fallback_values(in_band_mib):
    import torch

    rank = int(os.environ["RANK"])
    return [b"b" * (in_band_mib * MIB), torch.full((8 * MIB,), rank, dtype=torch.float32)]  # + 32 MiB


def scenario_fallback(limit, in_band_mib):
    run = distributed(num_accelerators=2, tracking=False, env={"AIRHOST_RESULT_SHM_LIMIT": limit})
    results = run(fallback_values).distributed(int(in_band_mib))
    out = {
        "ok": [r[0] == b"b" * (int(in_band_mib) * MIB) and bool((r[1] == rank).all()) and r[1].numel() == 8 * MIB
               for rank, r in enumerate(results)],
        "mapped_from": [maps_holding(r[1].data_ptr()) for r in results],
        "fds_while_held": result_fds(),
    }
    del results
    gc.collect()
    out["maps_after"] = result_mappings()
    out["left_in_run_dirs"] = leftovers()
    _helpers.report(out)


# ---- neither shared memory nor the disk can take it ----------------------------------------


def too_big_for_the_disk():
    import resource

    import torch

    if os.environ["RANK"] == "1":
        # Files of this process may not grow past 1 MiB: what a full disk looks like to it.
        resource.setrlimit(resource.RLIMIT_FSIZE, (MIB, MIB))
    return torch.ones(8 * MIB)


def scenario_disk_full():
    run = distributed(num_accelerators=2, tracking=False, env={"AIRHOST_RESULT_SHM_LIMIT": "0"})
    try:
        results = run(too_big_for_the_disk).distributed()
        out = {"returned": len(results)}
    except DistributedError as e:
        out = _helpers.describe_exception(e)
    out["left_in_run_dirs"] = leftovers()
    out["fds"] = result_fds()
    _helpers.report(out)


# ---- a rank killed while it writes its result ------------------------------------------------


def killed_while_writing():
    import signal
    import threading

    import torch

    value = torch.ones(64 * MIB)  # 256 MiB
    if os.environ["RANK"] == "1":

        def kill_when_half_written():
            while True:
                for fd in os.listdir("/proc/self/fd"):
                    try:
                        if "airhost-result" in os.readlink(f"/proc/self/fd/{fd}") and \
                                os.fstat(int(fd)).st_size > 64 * MIB:
                            os.kill(os.getpid(), signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.0002)

        threading.Thread(target=kill_when_half_written, daemon=True).start()
    return value


def scenario_killed_mid_result():
    shm_before = shm_entries()
    try:
        results = distributed(num_accelerators=2, tracking=False)(killed_while_writing).distributed()
        out = {"returned": [type(r).__name__ for r in results]}
    except DistributedError as e:
        out = _helpers.describe_exception(e)
        out["report_results"] = [r["result"] is not None for r in e.report["ranks"]]
        out["signals"] = [r["signal"] for r in e.report["ranks"]]
    gc.collect()
    out["maps_after"] = result_mappings()
    out["fds"] = result_fds()
    out["shm_added"] = sorted(set(shm_entries()) - set(shm_before))
    out["left_in_run_dirs"] = leftovers()
    _helpers.report(out)


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

"""Callers that do not grow: what a long-lived caller holds after many launches.

    .venv/bin/python bench/callers.py                    # 10,000 calls, 1,000 C++ launches (~15 min)
    .venv/bin/python bench/callers.py --calls 2000 --cpp-launches 300 --peer-calls 300

A notebook sweep is thousands of `.distributed()` calls in one kernel; a C++ service launches
through include/airhost/ for days. Each caller here is a process of its own that launches a
trivial function (1 rank) again and again and reports, after launch 100 and after the last,
its resident memory, open descriptors, threads and child processes. The figure is the growth
between the two: what the caller keeps per launch once it is warmed up.

Peer: the same loop with torch.multiprocessing (start_processes, fork, one process per call),
the way a Python program starts ranks without a launcher, measured in the same run.
Tracking is off (AIRHOST_TRACKING=0); warm starts are on (the API's default); run directories
go to a temporary root that is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FOOTPRINT = r'''
import os
def footprint():
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE") // 1024
    me = str(os.getpid())
    children = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    children += 1
        except (OSError, IndexError):
            pass
    return {"rss_kb": rss, "fds": len(os.listdir("/proc/self/fd")) - 1,
            "threads": len(os.listdir("/proc/self/task")), "children": children}
'''

AIRHOST_CALLER = FOOTPRINT + r'''
import json, sys
from airhost import distributed

@distributed(num_accelerators=1)
def trivial():
    return 1

n = int(sys.argv[1])
for i in range(1, n + 1):
    assert trivial.distributed() == [1]
    if i == 100 or i == n:
        print(json.dumps({"launch": i, **footprint()}), flush=True)
'''

TORCH_MP_CALLER = FOOTPRINT + r'''
import json, sys
import torch.multiprocessing as mp

def trivial(i):
    return 1

n = int(sys.argv[1])
for i in range(1, n + 1):
    mp.start_processes(trivial, nprocs=1, start_method="fork", join=True)
    if i == 100 or i == n:
        print(json.dumps({"launch": i, **footprint()}), flush=True)
'''


def run_caller(argv, env, timeout):
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    points = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            points.append(json.loads(line))
        elif line.startswith("embed_demo | after launch "):
            head, _, rest = line.partition(": ")
            p = {"launch": int(head.rsplit(" ", 1)[1])}
            p.update({k: int(v) for k, v in (kv.split("=") for kv in rest.split())})
            points.append(p)
    if len(points) != 2:
        raise RuntimeError(f"expected two footprints, got {done.stdout[-2000:]}")
    first, last = points
    return {"launches": last["launch"], "seconds": round(time.monotonic() - t0, 1), "after_100": first, "end": last,
            "rss_growth_kb": last["rss_kb"] - first["rss_kb"],
            "per_launch_bytes": round((last["rss_kb"] - first["rss_kb"]) * 1024 / max(1, last["launch"] - first["launch"]), 1),
            "fds": (first["fds"], last["fds"]), "threads": (first["threads"], last["threads"]),
            "children": (first["children"], last["children"])}


def build_embed_demo(work, build_dir):
    prefix = os.path.join(work, "prefix")
    subprocess.run(["cmake", "--install", build_dir, "--prefix", prefix], check=True, capture_output=True)
    build = os.path.join(work, "embed")
    subprocess.run(["cmake", "-S", os.path.join(ROOT, "examples", "embed_cpp"), "-B", build, "-G", "Ninja",
                    f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build], check=True, capture_output=True)
    return os.path.join(build, "embed_demo")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10000, help=".distributed() calls in one process")
    ap.add_argument("--cpp-launches", type=int, default=1000, help="launches of a C++ program through include/airhost/")
    ap.add_argument("--peer-calls", type=int, default=1000, help="torch.multiprocessing calls (0: skip)")
    ap.add_argument("--build-dir", default=os.environ.get("AIRHOST_TEST_BUILD_DIR", os.path.join(ROOT, "build", "dev")),
                    help="the airhost CMake build to install for the C++ caller ('' : skip it)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="airhost-callers-")
    env = dict(os.environ, AIRHOST_TRACKING="0", AIRHOST_RUNS_DIR=os.path.join(work, "runs"), AIRHOST_RETENTION="off")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    results = {}
    try:
        if a.calls:
            print(f"airhost .distributed(): {a.calls} calls ...", file=sys.stderr, flush=True)
            results["airhost_api"] = run_caller([sys.executable, "-c", AIRHOST_CALLER, str(a.calls)], env, 7200)
            shutil.rmtree(env["AIRHOST_RUNS_DIR"], ignore_errors=True)
        if a.cpp_launches and a.build_dir and os.path.exists(os.path.join(a.build_dir, "CMakeCache.txt")):
            print(f"C++ through include/airhost/: {a.cpp_launches} launches ...", file=sys.stderr, flush=True)
            demo = build_embed_demo(work, a.build_dir)
            results["airhost_cpp"] = run_caller(
                [demo, os.path.join(ROOT, "bench", "scripts", "trivial_fn.py"), "train", "1", str(a.cpp_launches)], env, 7200)
            shutil.rmtree(env["AIRHOST_RUNS_DIR"], ignore_errors=True)
        if a.peer_calls:
            print(f"torch.multiprocessing: {a.peer_calls} calls ...", file=sys.stderr, flush=True)
            results["torch_mp"] = run_caller([sys.executable, "-c", TORCH_MP_CALLER, str(a.peer_calls)], env, 7200)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if a.json:
        print(json.dumps(results, indent=2))
        return
    names = {"airhost_api": "airhost .distributed()", "airhost_cpp": "airhost C++ Launcher", "torch_mp": "torch.multiprocessing"}
    print(f"{'caller':<24} {'launches':>8} {'RSS after 100':>14} {'RSS at end':>11} {'growth':>9} {'per launch':>11}"
          f" {'fds':>7} {'threads':>8} {'children':>9} {'time':>8}")
    for key, r in results.items():
        print(f"{names[key]:<24} {r['launches']:>8} {r['after_100']['rss_kb'] / 1024:>11.1f} MB {r['end']['rss_kb'] / 1024:>8.1f} MB"
              f" {r['rss_growth_kb'] / 1024:>6.2f} MB {r['per_launch_bytes']:>9.0f} B"
              f" {'%d→%d' % r['fds']:>7} {'%d→%d' % r['threads']:>8} {'%d→%d' % r['children']:>9} {r['seconds']:>7.0f}s")


if __name__ == "__main__":
    main()

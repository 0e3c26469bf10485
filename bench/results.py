"""Results at memory speed: N ranks (4) each returning a 256 MiB tensor to the caller.

Prints three bandwidths measured in the same run, then two ratios:

  memcpy     numpy's copy of one 256 MiB array into memory already touched (np.copyto): what
             one core moves on this machine; the median of --repeats
  airhost    @distributed, every rank returning a 256 MiB float32 tensor: from the moment the
             ranks return (together, behind a barrier) until .distributed() has handed the
             caller all of them, the run over and every rank gone; the median of --repeats
  torch.mp   torch.multiprocessing, as many processes each putting the same tensor in a
             queue: from the same kind of barrier until the caller has got them all (the
             processes stay alive meanwhile, as that queue needs); the median of --repeats

  airhost / memcpy     target >= 0.5
  airhost / torch.mp   target >= 5

For context it also prints what one core takes to put 256 MiB into fresh shared memory
(os.write into a new memfd, the one copy a rank makes): on a machine where page allocation is
slow (a VM), that, not memcpy, bounds any design that copies the result once.

Both sides move N x 256 MiB and check what arrived. Usage:

  .venv/bin/python bench/results.py [--ranks 4] [--mib 256] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch


def memcpy_gbps(nbytes: int, repeats: int) -> float:
    src = np.full(nbytes, 7, dtype=np.uint8)
    dst = np.zeros_like(src)  # touched: the copy pays no page faults
    times = []
    for _ in range(max(5, repeats)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    assert dst[0] == 7 and dst[-1] == 7
    return nbytes / statistics.median(times) / 1e9


def memfd_write_gbps(nbytes: int, repeats: int) -> float:
    src = np.full(nbytes, 7, dtype=np.uint8)
    times = []
    for _ in range(max(3, repeats)):
        fd = os.memfd_create("airhost-bench", os.MFD_CLOEXEC)
        try:
            t0 = time.perf_counter()
            done = 0
            while done < nbytes:
                done += os.write(fd, memoryview(src)[done:])
            times.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
    return nbytes / statistics.median(times) / 1e9


# ---- airhost --------------------------------------------------------------------------


def _airhost_rank(barrier_dir: str, ranks: int, elements: int):
    rank = int(os.environ["RANK"])
    t = torch.full((elements,), float(rank), dtype=torch.float32)
    open(os.path.join(barrier_dir, f"ready-{rank}"), "w").close()
    while sum(name.startswith("ready-") for name in os.listdir(barrier_dir)) < ranks:
        time.sleep(0.0005)
    return time.time(), t


def airhost_seconds(ranks: int, elements: int) -> float:
    from airhost import distributed

    barrier = tempfile.mkdtemp(prefix="airhost-bench-")
    try:
        run = distributed(num_accelerators=ranks, tracking=False)(_airhost_rank)
        out = run.distributed(barrier, ranks, elements)
        t_done = time.time()
        returned = max(t for t, _ in out)
        for rank, (_, t) in enumerate(out):
            assert t.shape == (elements,) and t[0] == rank and t[-1] == rank and t[elements // 2] == rank
        return t_done - returned
    finally:
        shutil.rmtree(barrier, ignore_errors=True)


# ---- torch.multiprocessing ------------------------------------------------------------


def _mp_worker(rank, elements, queue, barrier, done):
    t = torch.full((elements,), float(rank), dtype=torch.float32)
    barrier.wait()
    queue.put((rank, time.time(), t))
    done.wait()  # the receiver takes the storage's descriptor from this process


def torch_mp_seconds(ranks: int, elements: int) -> float:
    ctx = torch.multiprocessing.get_context("spawn")
    queue, barrier, done = ctx.Queue(), ctx.Barrier(ranks + 1), ctx.Event()
    procs = [ctx.Process(target=_mp_worker, args=(r, elements, queue, barrier, done)) for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        barrier.wait()
        got = [queue.get(timeout=600) for _ in range(ranks)]
        t_done = time.time()
        put = max(t for _, t, _ in got)
        for rank, _, t in got:
            assert t.shape == (elements,) and t[0] == rank and t[-1] == rank and t[elements // 2] == rank
        del got
        return t_done - put
    finally:
        done.set()
        for p in procs:
            p.join(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=int, default=256, help="MiB each rank returns")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    nbytes = args.mib << 20
    elements = nbytes // 4
    total = args.ranks * nbytes

    runs_root = tempfile.mkdtemp(prefix="airhost-bench-runs-")
    os.environ["AIRHOST_RUNS_DIR"] = runs_root  # the runs' logs go away with the benchmark
    load_before = os.getloadavg()[0]
    try:
        memcpy = memcpy_gbps(nbytes, args.repeats)
        fresh = memfd_write_gbps(nbytes, args.repeats)
        ours = [airhost_seconds(args.ranks, elements) for _ in range(args.repeats)]
        theirs = [torch_mp_seconds(args.ranks, elements) for _ in range(args.repeats)]
    finally:
        shutil.rmtree(runs_root, ignore_errors=True)

    ours_gbps = total / statistics.median(ours) / 1e9
    theirs_gbps = total / statistics.median(theirs) / 1e9
    print(f"{args.ranks} ranks x {args.mib} MiB, median of {args.repeats} (GB/s = 1e9 bytes/s); "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"  memcpy (numpy copyto, {args.mib} MiB)          {memcpy:7.2f} GB/s")
    print(f"  (fresh shared memory: os.write to a memfd  {fresh:7.2f} GB/s, one core)")
    print(f"  airhost  @distributed results              {ours_gbps:7.2f} GB/s   "
          f"({statistics.median(ours):.3f} s; runs {', '.join(f'{s:.3f}' for s in ours)})")
    print(f"  torch.multiprocessing queue                {theirs_gbps:7.2f} GB/s   "
          f"({statistics.median(theirs):.3f} s; runs {', '.join(f'{s:.3f}' for s in theirs)})")
    print(f"  airhost / memcpy   = {ours_gbps / memcpy:6.2f}x   (target >= 0.5)")
    print(f"  airhost / torch.mp = {ours_gbps / theirs_gbps:6.2f}x   (target >= 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

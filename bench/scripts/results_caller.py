"""Results probe, run by the benchmark as its own process (so that each measurement starts
from a fresh caller):

    python results_caller.py airhost  RANKS MIB   # @distributed: each rank returns MIB MiB
    python results_caller.py mp-queue RANKS MIB   # torch.multiprocessing: each process puts
                                                  # its tensor on a Queue, the caller gets them
    python results_caller.py memcpy   1     MIB   # memcpy of one MIB MiB buffer, for scale
    python results_caller.py fresh-shm 1    MIB   # one write of MIB MiB into a new memfd: the
                                                  # one copy a rank makes of its result

Each rank (or process) fills a uint8 tensor of MIB MiB with rank + 1 (every page written,
as a real result would be), takes the time, and hands the tensor over. The window measured
is from the LAST rank's time stamp to the moment the caller holds every tensor: for
airhost, `.distributed()` returning (which it does once every rank has exited, so the
ranks' exit is inside airhost's window); for mp, the last tensor taken off the queue (the
processes' exit, `join`, comes after and is reported apart: the definition favours the
peer). The tensors are checked afterwards, outside the window: count, dtype, size, and
one byte of every MiB. One JSON line on stdout says what was measured."""
import json
import os
import sys
import time

import torch

MiB = 1 << 20


def produce(nbytes: int):
    """One rank's work: a filled tensor, and the time it was ready."""
    import os
    import time

    import torch

    t = torch.empty(nbytes, dtype=torch.uint8).fill_(int(os.environ.get("RANK", "0")) + 1)
    return time.time(), t


def check(results, ranks: int, nbytes: int) -> None:
    assert len(results) == ranks, f"{len(results)} results for {ranks} ranks"
    for r, (_, t) in enumerate(results):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.numel() == nbytes, \
            f"rank {r}: wrong result {type(t)} {getattr(t, 'dtype', '')} {getattr(t, 'shape', '')}"
        sample = t[::MiB]
        assert bool((sample == r + 1).all()), f"rank {r}: wrong bytes in its result"


def via_airhost(ranks: int, nbytes: int) -> dict:
    from airhost import distributed

    f = distributed(num_accelerators=ranks, tracking=False)(produce)
    t0 = time.time()
    results = f.distributed(nbytes)
    t1 = time.time()
    check(results, ranks, nbytes)
    return {"call": t1 - t0, "window": t1 - max(ready for ready, _ in results)}


def _mp_worker(index, nbytes, queue, done):
    os.environ["RANK"] = str(index)
    queue.put((index, *produce(nbytes)))
    done.wait()  # the caller must have the tensor before its shared memory's owner exits


def via_mp_queue(ranks: int, nbytes: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    t0 = time.time()
    procs = [ctx.Process(target=_mp_worker, args=(i, nbytes, queue, done)) for i in range(ranks)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(ranks):
        index, ready, t = queue.get()
        got[index] = (ready, t)
    t1 = time.time()  # the caller holds every tensor
    done.set()
    for p in procs:
        p.join()
    t2 = time.time()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * ranks, f"exit codes {codes}"
    results = [got[i] for i in range(ranks)]
    check(results, ranks, nbytes)
    return {"call": t1 - t0, "window": t1 - max(ready for ready, _ in results), "join": t2 - t1}


def memcpy(nbytes: int, times: int = 7) -> dict:
    """memcpy itself (ctypes.memmove is libc's memmove) between two buffers whose pages are
    already mapped: the best a copy of the result into the caller could do."""
    import ctypes
    import statistics

    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    seconds = []
    for _ in range(times):
        t0 = time.perf_counter()
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
        seconds.append(time.perf_counter() - t0)
    assert bool((dst[::MiB] == 1).all())
    return {"window": statistics.median(seconds), "copies": seconds}


def fresh_shm(nbytes: int, times: int = 7) -> dict:
    """One write of the result into fresh shared memory (a new memfd, pages not yet allocated):
    the one copy an airhost rank makes. On a VM where the kernel is slow to hand out pages,
    this, not memcpy, bounds any design that copies a result once."""
    import statistics

    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    view = memoryview(src.numpy())
    seconds = []
    for _ in range(times):
        fd = os.memfd_create("airhost-bench", os.MFD_CLOEXEC)
        try:
            t0 = time.perf_counter()
            done = 0
            while done < nbytes:
                done += os.write(fd, view[done:])
            seconds.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
    return {"window": statistics.median(seconds), "copies": seconds}


def main() -> None:
    mode, ranks, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    nbytes = mib * MiB
    if mode == "airhost":
        out = via_airhost(ranks, nbytes)
    elif mode == "mp-queue":
        out = via_mp_queue(ranks, nbytes)
    elif mode == "memcpy":
        out = memcpy(nbytes)
    elif mode == "fresh-shm":
        out = fresh_shm(nbytes)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    out.update(mode=mode, ranks=ranks, bytes=ranks * nbytes)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

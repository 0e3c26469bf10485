"""Warm-call probe of the Python API, run by the benchmark as its own process:

    python api_caller.py RANKS

One process making repeated calls back to back, as a sweep does (nothing waits for the warm
server here: a benchmark that waited would time a point no real script reaches). Call 1 starts
cold (and, as it ends, the process's own warm server); call 2 comes at once, while that server
still imports torch, and is not counted; call 3 is measured. Each rank's body is what every
training script does first, `import torch`, and a time stamp on the very next line:

  ready   call 3 started -> the LAST rank's stamp (the figure, set against torchrun's start-up)
  call    call 3 started -> `.distributed()` returned with every result (the whole call)

A call 3 whose ranks were not forked by the warm server fails the probe (exit 1): a warm
figure measured on cold ranks would be silently wrong. One JSON line on stdout says what was
measured; each rank of call 3 leaves a `call3` record (bench/scripts/_stamp.py)."""
import json
import os
import sys
import time

from airhost import _api, distributed


def body(call):
    import torch  # noqa: F401  (the point: the rank is ready to train only once this is done)
    t = time.time()

    from _stamp import rank, stamp

    stamp(f"call{call}", rank(), t=t, ppid=os.getppid())
    return t


def main() -> int:
    ranks = int(sys.argv[1])
    fn = distributed(num_accelerators=ranks)(body)
    t = time.time()
    fn.distributed(1)
    first = time.time() - t
    t = time.time()
    fn.distributed(2)
    second = time.time() - t
    server = _api.warm_server()
    if server is None:
        print("api_caller: no warm server was started", file=sys.stderr)
        return 1
    t0 = time.time()
    stamps = fn.distributed(3)
    t1 = time.time()
    stamps_dir = os.environ["AIRHOST_BENCH_STAMPS"]
    ppids = [json.load(open(os.path.join(stamps_dir, f"call3.{r}")))["ppid"] for r in range(ranks)]
    if any(ppid != server.pid for ppid in ppids):
        print(f"api_caller: call 3 started cold (rank parents {ppids}, warm server {server.pid})",
              file=sys.stderr)
        return 1
    print(json.dumps({"ready": max(stamps) - t0, "call": t1 - t0, "first_call": first, "second_call": second,
                      "per_rank": [s - t0 for s in stamps]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

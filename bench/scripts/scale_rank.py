"""One light rank of bench/scale.py: no torch (unless --ddp), a time stamp when it runs, then
what the scenario asks of it.

    start-<attempt>-<rank>   written as the rank runs its first line (after a gloo
                             all_reduce with --ddp): the time it was running
    fail-<rank>              written just before the chosen rank exits 1 (when <stamps>/go
                             appears; only in attempt 0 with --fail-once)

Every other rank waits: for <stamps>/done (then exits 0), or to be stopped."""
import os
import sys
import time

stamps = os.environ["SCALE_STAMPS"]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
args = sys.argv[1:]
fail_rank = int(args[args.index("--fail-rank") + 1]) if "--fail-rank" in args else -1
fail_once = "--fail-once" in args

if "--ddp" in args:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == dist.get_world_size()


def stamp(name: str) -> None:
    path = os.path.join(stamps, name)
    with open(path + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(path + ".tmp", path)


stamp(f"start-{attempt}-{rank}")
print("running", flush=True)

go, done = os.path.join(stamps, "go"), os.path.join(stamps, "done")
if rank == fail_rank and not (fail_once and attempt > 0):
    while not os.path.exists(go):
        time.sleep(0.01)
    stamp(f"fail-{rank}")
    sys.exit(1)
while not os.path.exists(done):
    time.sleep(0.25)

"""A rank of the recovery benchmark (bench/launch.py --only recovery): what a resumed
training script does first. It stamps `start` at its first line and `ready` once it is back
in the group (init_process_group and a barrier: where training goes on). On the first
attempt the last rank then writes its pid to $AIRHOST_BENCH_STAMPS/victim (for the benchmark
to SIGKILL) and waits; the others wait in an all_reduce that the loss breaks. On the next
attempt every rank just meets the others once more and ends."""
import os
import time

from _stamp import STAMP_ENV, stamp

t_start = time.time()
# Which attempt this is, from the benchmark's own mark (written once the victim is killed),
# not TORCHELASTIC_RESTART_COUNT: torchrun's agents count restarts each for itself, and an
# agent restarted by another node's failure (a membership change) does not count it.
attempt = 1 if os.path.exists(os.path.join(os.environ[STAMP_ENV], "killed")) else 0
rank = int(os.environ["RANK"])
stamp(f"start{attempt}", rank, t=t_start)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
dist.barrier()
stamp(f"ready{attempt}", rank, t=time.time())
if attempt == 0:
    if rank == dist.get_world_size() - 1:
        victim = os.path.join(os.environ[STAMP_ENV], "victim")
        with open(victim + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(victim + ".tmp", victim)
        while True:
            time.sleep(1)
    dist.all_reduce(torch.zeros(1))  # broken by the victim's death
    while True:
        time.sleep(1)
dist.barrier()
dist.destroy_process_group()

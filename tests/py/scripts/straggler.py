"""A run that crawls, for `airhost stacks --sample`: every step both ranks load a batch and
all-reduce, but rank 1's batches take 50 ms of CPU and rank 0's none, so rank 0 spends its
time waiting in all_reduce for rank 1, which spends its own in load_batch.

    straggler.py DIR   creates DIR/ready-RANK once the group is up; steps until DIR/release
                       exists (the ranks agree on it in the all-reduce), then exits 0"""
import os
import sys
import time

import torch
import torch.distributed as dist

DIR = sys.argv[1]
RELEASE = os.path.join(DIR, "release")


def load_batch(rank):
    until = time.monotonic() + (0.05 if rank == 1 else 0.0)
    while time.monotonic() < until:
        sum(range(1000))
    return torch.ones(1)


dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(DIR, f"ready-{rank}"), "w").close()
steps = 0
while True:
    batch = load_batch(rank)
    stop = torch.tensor([1.0 if rank == 0 and os.path.exists(RELEASE) else 0.0])
    dist.all_reduce(stop)
    steps += 1
    if stop.item() > 0:
        break
print(f"rank {rank} steps={steps}", flush=True)
dist.destroy_process_group()

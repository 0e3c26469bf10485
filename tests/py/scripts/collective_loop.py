"""Joins a gloo group, then all-reduces every 0.2 s: a job that notices a lost peer.

    collective_loop.py [--seconds S] [--fail-rank R] [--fail-after S]

Every rank prints "rank R ready" after the first all-reduce. --fail-rank R: rank R raises
ValueError("boom on rank R") after --fail-after seconds. Without --seconds it runs forever."""
import argparse
import time

import torch
import torch.distributed as dist

from emit import RANK, say

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=None)
p.add_argument("--fail-rank", type=int, default=None)
p.add_argument("--fail-after", type=float, default=1.0)
a = p.parse_args()

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
say(f"rank {RANK} ready world={dist.get_world_size()} sum={t.item():g}")
start = time.monotonic()
while a.seconds is None or time.monotonic() - start < a.seconds:
    if a.fail_rank == RANK and time.monotonic() - start >= a.fail_after:
        raise ValueError(f"boom on rank {RANK}")
    dist.all_reduce(t)
    time.sleep(0.2)
say(f"rank {RANK} done")
dist.destroy_process_group()

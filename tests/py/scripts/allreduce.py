"""Joins a gloo process group on MASTER_ADDR:MASTER_PORT and all-reduces rank+1."""
import os

import torch
import torch.distributed as dist

from emit import RANK, say

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
say(f"rank {RANK} MASTER_PORT={os.environ['MASTER_PORT']} sum={t.item():g}")
dist.destroy_process_group()

"""Joins a gloo group and prints what this rank sees of the world, as torchrun would set it:
"rank R local L group G world W local_world LW nodes N port P sum S" (S = 1 + ... + W)."""
import os

import torch
import torch.distributed as dist

from emit import say

e = os.environ
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
say(f"rank {e['RANK']} local {e['LOCAL_RANK']} group {e['GROUP_RANK']} world {e['WORLD_SIZE']} "
    f"local_world {e['LOCAL_WORLD_SIZE']} nodes {e['GROUP_WORLD_SIZE']} port {e['MASTER_PORT']} "
    f"sum {t.item():g} dist_rank {dist.get_rank()}")
dist.destroy_process_group()

"""A rank of the elastic benchmark (bench/elastic.py), under airhost or torchrun: once its group
has met (init_process_group and one all_reduce), it stamps `up-WORLD-RANK` with the time in
$ELASTIC_STAMPS, then trains on (an all_reduce every 20 ms) until it is stopped."""
import os
import time

import torch
import torch.distributed as dist

stamps = os.environ["ELASTIC_STAMPS"]
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
rank, world = dist.get_rank(), dist.get_world_size()
path = os.path.join(stamps, f"up-{world}-{rank}")
with open(path + ".tmp", "w") as f:
    f.write(repr(time.time()))
os.replace(path + ".tmp", path)
while True:
    dist.all_reduce(t)
    time.sleep(0.02)

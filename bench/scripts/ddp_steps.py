"""Steady-state probe: a gloo DDP MLP (32-128-128-1, batches of 64, SGD) runs a fixed
number of steps ($AIRHOST_BENCH_STEPS) between two barriers; each rank records how long its
loop took. The benchmark's figure is steps / the slowest rank's loop time."""
import gc
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from _stamp import stamp

steps = int(os.environ.get("AIRHOST_BENCH_STEPS", "600"))
dist.init_process_group("gloo")
rank = dist.get_rank()

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()
w = torch.randn(32, 1, generator=torch.Generator().manual_seed(0))
g = torch.Generator().manual_seed(1 + rank)
batches = []
for _ in range(16):
    x = torch.randn(64, 32, generator=g)
    batches.append((x, x @ w + 0.01 * torch.randn(64, 1, generator=g)))

for x, y in batches[:4]:  # a few uncounted steps: DDP builds its buckets on the first ones
    optimizer.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    optimizer.step()
dist.barrier()
t0 = time.perf_counter()
for step in range(steps):
    x, y = batches[step % len(batches)]
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
final_loss = loss.item()
loop = time.perf_counter() - t0
dist.barrier()
# Free the DDP model (its reducer holds gloo work) before the process group goes: with
# torch 2.13 a rank that still holds it aborts now and then at interpreter exit
# ("terminate called without an active exception"), under torchrun and airhost alike.
del model, optimizer, loss, x, y, batches
gc.collect()
dist.destroy_process_group()
stamp("steps", rank, loop=loop, steps=steps, loss=final_loss)
sys.exit(0 if math.isfinite(final_loss) else 3)

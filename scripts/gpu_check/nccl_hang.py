"""The GPU check's hang step (scripts/gpu-check.sh): an NCCL all-reduce that one rank never
enters. Every rank all-reduces three times on its GPU; then rank 1 waits in load_batch while
the others enter a fourth. airhost's --timeout ends the run: the host shows where each rank
is, asks NCCL's flight recorder of every rank for a dump through the pipe airhost names
(TORCH_NCCL_DEBUG_INFO_PIPE_FILE), and the failure summary says which rank never entered
which collective."""
import os
import time

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank()
t = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {rank} waits", flush=True)


def load_batch():
    while True:
        time.sleep(0.5)


if rank == 1:
    load_batch()
dist.all_reduce(t)  # the fourth, which rank 1 never enters
torch.cuda.synchronize()

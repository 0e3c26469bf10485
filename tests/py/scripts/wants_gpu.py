"""What the docs' example does first, on a machine with no GPU: `wants_gpu.py set_device` calls
torch.cuda.set_device(LOCAL_RANK) (CPU torch: AttributeError _cuda_setDevice); `wants_gpu.py
nccl` starts the nccl backend (CPU torch: no NCCL built in)."""
import os
import sys

import torch
import torch.distributed as dist

if sys.argv[1] == "set_device":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
else:
    dist.init_process_group("nccl")
print("a GPU after all", flush=True)

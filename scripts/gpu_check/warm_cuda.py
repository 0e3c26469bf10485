"""A rank forked by the warm server: CUDA must not be initialised yet (the server never touches
it), and this rank must be able to use the GPU. Prints one line; exits 1 on failure."""
import os
import sys

import torch

fresh = not torch.cuda.is_initialized()
if not torch.cuda.is_available():
    print(f"warm-cuda: no GPU visible to rank {os.environ['RANK']}", flush=True)
    sys.exit(0 if os.environ.get("AIRHOST_GPU_CHECK_REHEARSAL") == "1" else 1)
x = torch.randn(2048, 2048, device="cuda")
y = (x @ x).sum().item()
torch.cuda.synchronize()
print(f"warm-cuda: rank {os.environ['RANK']} cuda initialised before use: {not fresh}; "
      f"matmul on {torch.cuda.get_device_name()} ok ({y:.3g})", flush=True)
sys.exit(0 if fresh else 1)

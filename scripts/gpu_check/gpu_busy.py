"""The GPU check's `usage` step: each rank holds 2 GiB on its GPU and multiplies matrices for
SECONDS (default 12), so that the host's samples (every 5 s) find it busy there."""
import os
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 12.0
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
held = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
until = time.monotonic() + seconds
while time.monotonic() < until:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
print(f"rank {os.environ['RANK']} held {held.numel() >> 20} MiB on cuda:{torch.cuda.current_device()}", flush=True)

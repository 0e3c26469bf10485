"""Shared by the checkpoint scripts that airhost runs on 2 gloo ranks: a small model, a few
real training steps, deep copies of state dicts and an exact comparison of them."""
from __future__ import annotations

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor


class MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


def rank_world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def train(model, optimizer, steps: int, seed: int) -> None:
    """Real steps on data that differs per rank and per call, so both the weights and Adam's
    moments change between checkpoints."""
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def snapshot(value):
    """A deep copy of a (nested) state dict; DTensors become copies of this rank's shard."""
    if isinstance(value, DTensor):
        return value.to_local().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value)
    return value


def differences(a, b, where: str = "") -> list[str]:
    """Where two snapshots differ (exact comparison: a checkpoint round trip is bit-exact)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{where}: {type(a).__name__} vs {type(b).__name__}"]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            return [f"{where}: tensors differ ({tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype})"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, set(a) ^ set(b)))} on one side only"]
        out = []
        for k in a:
            out += differences(a[k], b[k], f"{where}.{k}" if where else str(k))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: lengths {len(a)} vs {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{where}[{i}]")
        return out
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def expect_equal(label: str, got, want) -> None:
    diff = differences(got, want)
    if diff:
        raise AssertionError(f"{label}: the loaded state differs from the saved one:\n  " + "\n  ".join(diff[:20]))
    print(f"{label}: equal", flush=True)


def report(**fields) -> None:
    """One JSON line the test reads from the rank's log."""
    print("RESULT " + json.dumps(fields, sort_keys=True), flush=True)


def shutdown() -> None:
    """Leaves the process group once the caller has dropped its models and optimizers: torch
    2.13 + gloo ranks still holding DDP/FSDP state at exit abort now and then."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def root_from_argv() -> str:
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {os.path.basename(sys.argv[0])} CHECKPOINT_ROOT")
    return sys.argv[1]

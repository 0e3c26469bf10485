"""The MLP of the docs, trained with DistributedDataParallel on every rank.

    airhost examples/mlp_ddp.py --accelerators 4              # CPU ranks (gloo) or GPUs (nccl)
    airhost examples/mlp_ddp.py --accelerators 4 -- --epochs 10
    airhost examples/mlp_ddp.py:main --accelerators 4         # main() returns the final loss

Unchanged code for torchrun: `torchrun --nproc-per-node 4 examples/mlp_ddp.py`.
"""
import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SimpleMLP(nn.Module):
    def __init__(self, input_dim=10, hidden_dim=64, output_dim=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(input_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, output_dim),
        )

    def forward(self, x):
        return self.net(x)


def setup():
    """Joins the process group: nccl on GPUs, gloo on CPU ranks."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def make_dataset(n=4096, input_dim=10, seed=0):
    # The same synthetic regression on every rank: y = x·w + noise.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, input_dim, generator=g)
    w = torch.randn(input_dim, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def train(num_epochs=5, batch_size=64, lr=0.01):
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical initial weights; DDP also broadcasts rank 0's
    model = DDP(SimpleMLP().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()

    epoch_loss = float("nan")
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        # The mean over all ranks, so every rank reports the same number.
        t = torch.tensor([total / batches], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        epoch_loss = t.item() / world
        if rank == 0:
            print(f"epoch {epoch + 1}/{num_epochs}  loss {epoch_loss:.5f}", flush=True)
    # Free the DDP model (its reducer holds gloo work) before the process group goes: with
    # torch 2.13 a rank that still holds it aborts now and then at interpreter exit
    # ("terminate called without an active exception"), under torchrun and airhost alike.
    del model, optimizer, loss
    gc.collect()
    dist.destroy_process_group()
    return epoch_loss


def main():
    """Entry point for `airhost examples/mlp_ddp.py:main`: returns the final loss."""
    return train()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    a = parser.parse_args()
    final = train(a.epochs, a.batch_size, a.lr)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"final loss {final:.5f}", flush=True)
    sys.exit(0 if final < 0.05 else 1)

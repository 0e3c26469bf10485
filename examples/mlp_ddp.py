"""The MLP of the docs, trained with DistributedDataParallel on every rank.

    airhost examples/mlp_ddp.py --accelerators 4              # CPU ranks (gloo) or GPUs (nccl)
    airhost examples/mlp_ddp.py --accelerators 4 -- --epochs 10
    airhost examples/mlp_ddp.py:main --accelerators 4         # main() returns the final loss
    python examples/mlp_ddp.py --via-api --accelerators 4     # the same through @distributed

From Python (a notebook, another script), with examples/ on sys.path:

    from airhost import distributed
    from mlp_ddp import main
    losses = distributed(num_accelerators=4)(main).distributed()   # one final loss per rank

Unchanged code for torchrun: `torchrun --nproc-per-node 4 examples/mlp_ddp.py`.
"""
import argparse
import gc
import hashlib
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


def fingerprint(state_dict):
    """sha256 of the names and exact bytes of the tensors: equal only for bit-identical weights."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous().view(-1)
        h.update(name.encode())
        h.update(bytes(t.view(torch.uint8).tolist()))
    return h.hexdigest()


def train(num_epochs=5, batch_size=64, lr=0.01, details=False):
    """Trains and returns the final loss (the mean over ranks of the last epoch).

    details=True returns a dict instead, with what a caller needs to check that the replicas
    stayed one model: the fingerprint of the weights on this rank and on every rank. It has
    to be computed here, since the model is freed before the process group goes (see the
    end)."""
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
    losses = []
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
        losses.append(epoch_loss)
        if rank == 0:
            print(f"epoch {epoch + 1}/{num_epochs}  loss {epoch_loss:.5f}", flush=True)
    result = epoch_loss
    if details:
        weights = model.module.state_dict()
        digest = fingerprint(weights)
        every = [None] * world
        dist.all_gather_object(every, digest)
        numel = sum(t.numel() for t in weights.values())
        result = {
            "rank": rank, "world": world, "backend": dist.get_backend(), "device": str(device),
            "loss": epoch_loss, "losses": losses, "sha256": digest, "all_sha256": every,
            "numel": numel, "local_numel": numel,  # every replica updates all of its weights
        }
        del weights
    # Free the DDP model (its reducer holds gloo work) before the process group goes: with
    # torch 2.13 a rank that still holds it aborts now and then at interpreter exit
    # ("terminate called without an active exception"), under torchrun and airhost alike.
    del model, optimizer, loss
    gc.collect()
    dist.destroy_process_group()
    return result


def main():
    """Entry point for `airhost examples/mlp_ddp.py:main`: returns the final loss."""
    return train()


def run_distributed(num_accelerators=None, **train_kwargs):
    """train() on every rank through `@distributed`; returns the results, by rank."""
    from airhost import distributed

    return distributed(num_accelerators=num_accelerators)(train).distributed(**train_kwargs)


def report(results, threshold):
    """Prints one line per rank; True when the ranks agree on the weights and converged."""
    for r in results:
        print(f"rank {r['rank']} ({r['backend']}, {r['device']}): final loss {r['loss']:.5f}, "
              f"{r['numel']} weights ({r['local_numel']} updated by this rank), sha256 {r['sha256'][:16]}",
              flush=True)
    agree = len({r["sha256"] for r in results}) == 1 and all(r["all_sha256"] == [r["sha256"]] * r["world"]
                                                             for r in results)
    print("the ranks hold the same weights" if agree else "the ranks DISAGREE on the weights", flush=True)
    return agree and results[0]["loss"] < threshold


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--via-api", action="store_true",
                        help="launch the ranks from here through airhost's @distributed")
    parser.add_argument("--accelerators", type=int, default=None, help="ranks for --via-api")
    a = parser.parse_args()
    if a.via_api:
        results = run_distributed(a.accelerators, num_epochs=a.epochs, batch_size=a.batch_size, lr=a.lr,
                                  details=True)
        sys.exit(0 if report(results, threshold=0.05) else 1)
    final = train(a.epochs, a.batch_size, a.lr)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"final loss {final:.5f}", flush=True)
    sys.exit(0 if final < 0.05 else 1)

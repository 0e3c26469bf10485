"""The MLP of the docs, trained with FSDP2 (`torch.distributed.fsdp.fully_shard`) on every rank.

    airhost examples/fsdp.py --accelerators 2                 # CPU ranks (gloo) or GPUs (nccl)
    airhost examples/fsdp.py --accelerators 4 -- --epochs 10
    airhost examples/fsdp.py:main --accelerators 2            # main() returns the final loss
    python examples/fsdp.py --via-api --accelerators 2        # the same through @distributed

From Python (a notebook, another script), with examples/ on sys.path:

    from airhost import distributed
    from fsdp import main
    losses = distributed(num_accelerators=2)(main).distributed()   # one final loss per rank

Each rank keeps only its shard of every parameter and of the Adam state; the full weights
exist only while a layer runs (all-gathered) and, at the end, in the state dict gathered
the way a checkpoint is saved. Unchanged code for torchrun: `torchrun --nproc-per-node 2
examples/fsdp.py`.
"""
import argparse
import gc
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
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
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)  # before NCCL's first communicator, which binds a GPU
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
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

    details=True returns a dict instead, with what a caller needs to check that sharded
    training kept one model: the fingerprint of the full weights on this rank and on every
    rank, and how many of them this rank updated. It has to be computed here, since the
    model is freed before the process group goes (see the end)."""
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)  # the same full weights on every rank, before each keeps its shard
    model = SimpleMLP().to(device)
    # One FSDP unit per Linear, then the root: a layer's full weights are gathered only
    # while it runs, as in a real model where they would not all fit at once.
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)  # built on the shards: sharded state
    loss_fn = nn.MSELoss()

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
        losses.append(t.item() / world)
        if rank == 0:
            print(f"epoch {epoch + 1}/{num_epochs}  loss {losses[-1]:.5f}", flush=True)
    epoch_loss = losses[-1] if losses else float("nan")

    result = epoch_loss
    if details:
        # A collective: every rank must call it. Each gets the full, unsharded weights.
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        digest = fingerprint(full)
        every = [None] * world
        dist.all_gather_object(every, digest)
        result = {
            "rank": rank, "world": world, "backend": dist.get_backend(), "device": str(device),
            "loss": epoch_loss, "losses": losses, "sha256": digest, "all_sha256": every,
            "numel": sum(t.numel() for t in full.values()),
            "local_numel": sum(p.to_local().numel() for p in model.parameters()),
        }
        del full
    # Free the sharded model (its hooks and gloo work) before the process group goes: with
    # torch 2.13 a rank that still holds it aborts now and then at interpreter exit
    # ("terminate called without an active exception").
    del model, optimizer, loss
    gc.collect()
    dist.destroy_process_group()
    return result


def main():
    """Entry point for `airhost examples/fsdp.py:main`: returns the final loss."""
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
    kwargs = dict(num_epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, details=True)
    if a.via_api:
        ok = report(run_distributed(a.accelerators, **kwargs), threshold=0.05)
        sys.exit(0 if ok else 1)
    r = train(**kwargs)
    agree = r["all_sha256"] == [r["sha256"]] * r["world"]
    if r["rank"] == 0:
        print(f"final loss {r['loss']:.5f}", flush=True)
        print(f"weights sha256 {r['sha256'][:16]} on all {r['world']} ranks" if agree
              else f"the ranks DISAGREE on the weights: {r['all_sha256']}", flush=True)
    sys.exit(0 if agree and r["loss"] < 0.05 else 1)

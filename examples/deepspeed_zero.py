"""The MLP of the docs, trained with DeepSpeed ZeRO (stage 3 by default) on every rank.

    airhost examples/deepspeed_zero.py --accelerators 2                  # CPU ranks (gloo) or GPUs (nccl)
    airhost examples/deepspeed_zero.py --accelerators 2 -- --stage 2
    airhost examples/deepspeed_zero.py:main --accelerators 2             # main() returns the final loss
    python examples/deepspeed_zero.py --via-api --accelerators 2         # the same through @distributed

From Python (a notebook, another script), with examples/ on sys.path:

    from airhost import distributed
    from deepspeed_zero import main
    losses = distributed(num_accelerators=2)(main).distributed()   # one final loss per rank

The ZeRO settings are in deepspeed_zero.json, next to this file. It turns off the gradient
clipping DeepSpeed does by default (to norm 1.0), so that this example does the arithmetic of
mlp_ddp.py and fsdp.py and reaches the same losses. The `deepspeed` launcher is not needed:
airhost gives each rank the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) that `deepspeed.init_distributed()` reads.

DeepSpeed picks its accelerator by itself: CUDA where torch sees a GPU, else its CPU
accelerator, which talks gloo (oneCCL when oneccl_bindings_for_pytorch is installed). The
optimizer is torch's Adam, not DeepSpeed's FusedAdam or DeepSpeedCPUAdam: those are C++/CUDA
ops that DeepSpeed compiles on first use, and plain Adam gives the same updates on any device.
"""
import argparse
import gc
import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
from deepspeed import ops as deepspeed_ops  # not `deepspeed.ops` in a function: see setup()
from deepspeed.accelerator import get_accelerator
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CONFIG = Path(__file__).resolve().with_name("deepspeed_zero.json")


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
    """Joins the process group through DeepSpeed, on the backend of its accelerator."""
    # DeepSpeed 0.19 calls collectives that torch 2.13 deprecates, and the FutureWarning
    # comes again at every step, two lines per rank each time: nothing a user can act on.
    warnings.filterwarnings(
        "ignore", category=FutureWarning,
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    accelerator = get_accelerator()
    if accelerator.device_name() == "cpu":
        # DeepSpeed's CPU backend would JIT-compile its shared-memory all-reduce op here
        # (about 100 s of g++ on a 2-core machine the first time, then cached in
        # ~/.cache/torch_extensions). Only its inference all-reduce uses that op, never ZeRO
        # training, so skip building it.
        # (Spelt through a module global: cloudpickle, sending this function by value for
        # @distributed, would try to pickle torch.ops for any `.ops` in a function's code.)
        deepspeed_ops.__compatible_ops__["deepspeed_shm_comm"] = False
        device = torch.device("cpu")
    else:
        local_rank = int(os.environ["LOCAL_RANK"])
        accelerator.set_device(local_rank)  # before NCCL's first communicator, which binds a GPU
        device = torch.device(accelerator.device_name(), local_rank)
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    return device


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


def full_weights(engine):
    """The full weights on every rank. Under ZeRO-3 each rank holds a partition of every
    parameter; GatheredParameters all-gathers them for the length of the block."""
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None,
                                           enabled=engine.zero_optimization_partition_weights()):
        return {name: p.detach().clone().cpu() for name, p in params.items()}


def updated_here(engine):
    """Elements of the fp32 master weights that this rank's optimizer step updates: its ZeRO
    partition, about 1/world of the model at every stage."""
    opt = engine.optimizer
    flats = getattr(opt, "fp32_partitioned_groups_flat", None)  # stage 3
    if flats is None:
        flats = getattr(opt, "single_partition_of_fp32_groups", None)  # stages 1 and 2
    if flats is None:  # stage 0: plain data parallelism, every rank updates everything
        return sum(p.numel() for p in engine.module.parameters())
    return sum(t.numel() for t in flats)


def train(num_epochs=5, batch_size=64, lr=0.01, stage=None, details=False):
    """Trains and returns the final loss (the mean over ranks of the last epoch).

    stage: the ZeRO stage (0-3), else the one in deepspeed_zero.json. details=True returns a
    dict instead, with what a caller needs to check that partitioned training kept one model:
    the fingerprint of the full weights on this rank and on every rank, and how many of them
    this rank updated. It has to be computed here, since the engine is freed before the
    process group goes (see the end)."""
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    config = json.loads(CONFIG.read_text())
    config["train_micro_batch_size_per_gpu"] = batch_size
    if stage is not None:
        config["zero_optimization"]["stage"] = stage
    torch.manual_seed(0)  # the same initial weights on every rank
    model = SimpleMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    loss_fn = nn.MSELoss()

    losses = []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(engine(x), y)
            engine.backward(loss)  # reduce-scatters the gradients to their owners
            engine.step()  # each rank updates its partition, then the weights are shared again
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
        full = full_weights(engine)  # a collective under ZeRO-3: every rank calls it
        digest = fingerprint(full)
        every = [None] * world
        dist.all_gather_object(every, digest)
        result = {
            "rank": rank, "world": world, "backend": dist.get_backend(), "device": str(device),
            "stage": engine.zero_optimization_stage(), "loss": epoch_loss, "losses": losses,
            "sha256": digest, "all_sha256": every, "numel": sum(t.numel() for t in full.values()),
            "local_numel": updated_here(engine),
        }
        del full
    # Free the engine (its hooks and gloo work) before the process group goes: with torch
    # 2.13 a rank that still holds a distributed model aborts now and then at interpreter exit
    # ("terminate called without an active exception").
    del engine, optimizer, model, loss
    gc.collect()
    dist.destroy_process_group()
    return result


def main():
    """Entry point for `airhost examples/deepspeed_zero.py:main`: returns the final loss."""
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
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="ZeRO stage (default: the one in deepspeed_zero.json)")
    parser.add_argument("--via-api", action="store_true",
                        help="launch the ranks from here through airhost's @distributed")
    parser.add_argument("--accelerators", type=int, default=None, help="ranks for --via-api")
    a = parser.parse_args()
    kwargs = dict(num_epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, stage=a.stage, details=True)
    if a.via_api:
        ok = report(run_distributed(a.accelerators, **kwargs), threshold=0.05)
        sys.exit(0 if ok else 1)
    r = train(**kwargs)
    agree = r["all_sha256"] == [r["sha256"]] * r["world"]
    if r["rank"] == 0:
        print(f"final loss {r['loss']:.5f} (ZeRO stage {r['stage']})", flush=True)
        print(f"weights sha256 {r['sha256'][:16]} on all {r['world']} ranks" if agree
              else f"the ranks DISAGREE on the weights: {r['all_sha256']}", flush=True)
    sys.exit(0 if agree and r["loss"] < 0.05 else 1)

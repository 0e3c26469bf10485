"""Rank 1 SIGKILLs itself in the middle of the second save; the test then looks at what is on
disk. The kill is real and happens inside write_data of a VolumeWriter subclass:

    mid-write     rank 1 dies while its shard stream is open, after part of it was written
    after-shard   rank 1 dies after its shard was published, before the gather that lets
                  rank 0 write .metadata

    airhost tests/py/ckpt_scripts/crash.py --accelerators 2 -- CHECKPOINT_ROOT MODE
"""
from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import MLP, rank_world, train
from airhost.data import VolumeWriter

MODES = ("mid-write", "after-shard")


def die(why: str) -> None:
    print(f"rank {dist.get_rank()} dying {why}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class DyingWriter(VolumeWriter):
    def __init__(self, path, mode: str):
        super().__init__(path)
        self.mode = mode

    def write_data(self, plan, planner):
        if dist.get_rank() != 1:
            return super().write_data(plan, planner)
        if self.mode == "after-shard":
            future = super().write_data(plan, planner)
            die(f"after-shard: its shard published, the directory holds {sorted(os.listdir(self.path))}")
            return future
        # mid-write: torch resolves each item right before writing it into the open shard
        # stream, so dying on the third item leaves two items in the staging file.
        resolve, calls = planner.resolve_data, []

        def resolve_then_die(item):
            calls.append(item)
            if len(calls) == 3:
                die(f"mid-write: its shard stream open, the directory holds {sorted(os.listdir(self.path))}")
            return resolve(item)

        planner.resolve_data = resolve_then_die
        return super().write_data(plan, planner)


def main() -> None:
    root, mode = sys.argv[1], sys.argv[2]
    assert mode in MODES, mode
    dist.init_process_group("cpu:gloo")
    rank, _ = rank_world()
    torch.manual_seed(0)
    model = DDP(MLP())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, steps=2, seed=1)

    def state():
        model_sd, optim_sd = get_state_dict(model, optimizer)
        # Per-rank entries, so that rank 1 surely has tensors of its own to write.
        extra = {f"rank{rank}": {f"t{i}": torch.full((64,), float(rank * 10 + i)) for i in range(4)}}
        return {"model": model_sd, "optim": optim_sd, "extra": extra}

    dcp.save(state(), storage_writer=VolumeWriter(os.path.join(root, "step-000001")))
    print(f"rank {rank} saved step-000001", flush=True)
    train(model, optimizer, steps=2, seed=2)
    dcp.save(state(), storage_writer=DyingWriter(os.path.join(root, "step-000002"), mode))
    # Not reached: rank 1 is dead, and rank 0 waits for its write results until airhost stops it.
    print(f"rank {rank} finished a save it should not have", flush=True)


if __name__ == "__main__":
    main()

"""DDP on cpu:gloo: dcp.save, then dcp.async_save, through VolumeWriter; both loaded back into
fresh models, the newest through latest_checkpoint + VolumeReader, the older one through
torch's plain FileSystemReader.

    airhost tests/py/ckpt_scripts/ddp.py --accelerators 2 -- CHECKPOINT_ROOT
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import MLP, expect_equal, rank_world, report, root_from_argv, shutdown, snapshot, train
from airhost.data import VolumeReader, VolumeWriter, latest_checkpoint


def state(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "extra": {"step": torch.tensor(0)}}


def fresh(seed: int):
    torch.manual_seed(seed)  # other weights than the saved ones; DDP broadcasts rank 0's
    model = DDP(MLP())
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def load_into_fresh(reader, seed: int) -> dict:
    model, optimizer = fresh(seed)
    sd = state(model, optimizer)
    dcp.load(sd, storage_reader=reader)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    loaded = snapshot(state(model, optimizer))
    loaded["extra"] = snapshot(sd["extra"])
    del model, optimizer
    return loaded


def main() -> None:
    root = root_from_argv()
    dist.init_process_group("cpu:gloo")  # a CPU backend is what dcp.async_save asks for
    rank, world = rank_world()
    model, optimizer = fresh(0)

    train(model, optimizer, steps=3, seed=1)
    sd = state(model, optimizer)
    sd["extra"]["step"] = torch.tensor(1)
    dcp.save(sd, storage_writer=VolumeWriter(os.path.join(root, "step-000001")))
    saved1 = snapshot(sd)

    train(model, optimizer, steps=3, seed=2)
    sd = state(model, optimizer)
    sd["extra"]["step"] = torch.tensor(2)
    future = dcp.async_save(sd, storage_writer=VolumeWriter(os.path.join(root, "step-000002")))
    saved2 = snapshot(sd)
    future.result()  # the same group as training: wait before the next collective

    train(model, optimizer, steps=2, seed=3)  # move away from both checkpoints

    newest = latest_checkpoint(root)
    assert newest == os.path.join(root, "step-000002"), newest
    expect_equal(f"rank {rank} VolumeReader(latest_checkpoint)", load_into_fresh(VolumeReader(newest), 7), saved2)
    plain = dcp.FileSystemReader(os.path.join(root, "step-000001"))
    expect_equal(f"rank {rank} FileSystemReader(step-000001)", load_into_fresh(plain, 8), saved1)

    report(rank=rank, world=world, newest=newest, backend=str(dist.get_backend()))
    del model, optimizer, sd
    shutdown()


if __name__ == "__main__":
    main()

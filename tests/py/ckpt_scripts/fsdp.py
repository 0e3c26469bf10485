"""FSDP2 (fully_shard on a CPU device mesh, gloo): each rank saves only its shards. dcp.save
and dcp.async_save through VolumeWriter, the async one on a separate gloo group while training
goes on; both loaded back into freshly sharded models, by VolumeReader and by torch's plain
FileSystemReader.

    airhost tests/py/ckpt_scripts/fsdp.py --accelerators 2 -- CHECKPOINT_ROOT
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from _common import MLP, expect_equal, rank_world, report, root_from_argv, shutdown, snapshot, train
from airhost.data import VolumeReader, VolumeWriter, latest_checkpoint


def sharded(seed: int, mesh):
    torch.manual_seed(seed)
    model = MLP()
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def state(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def load_into_fresh(reader, seed: int, mesh) -> dict:
    model, optimizer = sharded(seed, mesh)
    sd = state(model, optimizer)
    dcp.load(sd, storage_reader=reader)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    loaded = snapshot(state(model, optimizer))
    del model, optimizer, sd
    return loaded


def main() -> None:
    root = root_from_argv()
    dist.init_process_group("gloo")
    rank, world = rank_world()
    mesh = init_device_mesh("cpu", (world,))
    checkpoint_group = dist.new_group(backend="gloo")  # async saves talk here, training elsewhere
    model, optimizer = sharded(0, mesh)

    train(model, optimizer, steps=3, seed=1)
    sd = state(model, optimizer)
    dcp.save(sd, storage_writer=VolumeWriter(os.path.join(root, "step-000001")))
    saved1 = snapshot(sd)
    local_shapes = {k: list(v.to_local().shape) for k, v in sd["model"].items()}

    train(model, optimizer, steps=3, seed=2)
    sd = state(model, optimizer)
    future = dcp.async_save(sd, storage_writer=VolumeWriter(os.path.join(root, "step-000002")),
                            process_group=checkpoint_group)
    saved2 = snapshot(sd)
    train(model, optimizer, steps=2, seed=3)  # overlaps the upload: it works on a staged copy
    future.result()

    newest = latest_checkpoint(root)
    assert newest == os.path.join(root, "step-000002"), newest
    expect_equal(f"rank {rank} VolumeReader(latest_checkpoint)", load_into_fresh(VolumeReader(newest), 7, mesh), saved2)
    plain = dcp.FileSystemReader(os.path.join(root, "step-000001"))
    expect_equal(f"rank {rank} FileSystemReader(step-000001)", load_into_fresh(plain, 8, mesh), saved1)

    report(rank=rank, world=world, newest=newest, local_shapes=local_shapes)
    del model, optimizer, sd
    dist.destroy_process_group(checkpoint_group)
    shutdown()


if __name__ == "__main__":
    main()

"""DDP training that checkpoints every few steps with airhost.data.VolumeWriter and, when
airhost restarts it, resumes from airhost.data.latest_checkpoint. Deterministic for a seed:
each step's batch comes from a generator seeded by (seed, step, rank), so a resumed run must
end with exactly the parameters of an uninterrupted one.

    airhost train_resume.py -n 2 --max-restarts 1 -- --ckpt DIR --out FINAL.pt
        [--steps 30] [--every 5] [--stall-at 17] [--stall-rank 1]

--stall-at S: on the first attempt, rank 1 (--stall-rank) writes <ckpt>/stalled (its pid) on
reaching step S and waits there, for the test to SIGKILL it in the middle of training.

--wait-warning-at S: in a run from scratch, every rank waits at step S (rank 0 writes
<ckpt>/waiting) until the scheduler's warning comes (airhost.preemption_requested()), then
checkpoints step S and raises airhost.Preempted, as a loop does before its time limit. With
it, the loop asks at every step.
"""
import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

import airhost
from airhost.data import VolumeReader, VolumeWriter, latest_checkpoint


def batch(seed: int, step: int, rank: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(32, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--stall-at", type=int, default=-1)
    p.add_argument("--stall-rank", type=int, default=1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--wait-warning-at", type=int, default=-1)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(a.seed)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    start = 0
    ckpt = latest_checkpoint(a.ckpt)
    if ckpt is not None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
        dcp.load(state, storage_reader=VolumeReader(ckpt))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"])
        if rank == 0:
            print(f"attempt {attempt}: resumed from {os.path.basename(ckpt)} at step {start}", flush=True)
    elif rank == 0:
        print(f"attempt {attempt}: starting from scratch", flush=True)

    def save(done):
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd, "step": torch.tensor(done)},
                 storage_writer=VolumeWriter(os.path.join(a.ckpt, f"step-{done:06d}")))

    for step in range(start, a.steps):
        if a.wait_warning_at >= 0:
            if step == a.wait_warning_at and ckpt is None:  # a run from scratch, not a resumed one
                if rank == 0:
                    open(os.path.join(a.ckpt, "waiting"), "w").close()
                while not airhost.preemption_requested():
                    time.sleep(0.2)
            if airhost.preemption_requested():
                save(step)
                if rank == 0:
                    print(f"step {step}: the scheduler's warning came; checkpoint saved", flush=True)
                raise airhost.Preempted(f"checkpointed at step {step}")
        if step == a.stall_at and attempt == 0 and rank == a.stall_rank:
            with open(os.path.join(a.ckpt, "stalled.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(a.ckpt, "stalled.tmp"), os.path.join(a.ckpt, "stalled"))
            while True:  # until the test kills this rank
                time.sleep(1)
        x, y = batch(a.seed, step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        done = step + 1
        if done % a.every == 0 and done < a.steps:
            save(done)
            if rank == 0:
                print(f"step {done}: loss {loss.item():.6f}, checkpoint saved", flush=True)

    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, a.out)
        print(f"finished {a.steps} steps, final loss {loss.item():.6f}", flush=True)
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

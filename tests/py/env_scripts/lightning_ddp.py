"""A Lightning DDP script as a user writes it for torchrun (no airhost in it): 2 CPU devices,
DDP over gloo, a few optimizer steps. Each process prints one `@@ENV@@ {json}` line saying
what Lightning made of its environment (tests/py/test_framework_env.py); lightning_api.py
reuses `describe()` for the same record from a @distributed function.

Every rank seeds its weights with its own rank, so equal parameters after fit() prove that
DDP really broadcast and all-reduced through a live process group."""
import json
import os
import sys

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

STEPS = 4


class TinyRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def regression_data() -> DataLoader:
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def describe(trainer: L.Trainer, model: torch.nn.Module) -> dict:
    """What Lightning decided about this process, after fit(). `launcher_children` counts
    the processes Lightning's own launcher started: 0 when it left process creation to the
    launcher it detected, as it does under torchrun."""
    gathered = trainer.strategy.all_gather(torch.tensor([trainer.global_rank]))
    launcher = trainer.strategy.launcher
    env = trainer.strategy.cluster_environment
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "num_devices": trainer.num_devices,
        "strategy": type(trainer.strategy).__name__,
        "cluster_environment": type(env).__name__,
        "creates_processes_externally": env.creates_processes_externally,
        "launcher_children": len(getattr(launcher, "procs", None) or []),
        "dist_initialized": dist.is_initialized(),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "dist_rank": dist.get_rank() if dist.is_initialized() else None,
        "dist_world_size": dist.get_world_size() if dist.is_initialized() else None,
        "gathered_ranks": gathered.flatten().tolist(),
        "global_step": trainer.global_step,
        "checksum": float(sum(p.detach().double().sum() for p in model.parameters())),
    }


def main(devices: int) -> dict:
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=devices, max_steps=STEPS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    torch.manual_seed(trainer.global_rank)  # different initial weights on every rank
    model = TinyRegressor()
    trainer.fit(model, regression_data())
    return describe(trainer, model)


if __name__ == "__main__":
    record = main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print("@@ENV@@ " + json.dumps(record), flush=True)

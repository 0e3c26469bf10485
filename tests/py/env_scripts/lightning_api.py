"""Lightning from a notebook-style caller: the LightningModule and the training function are
defined here, in __main__, and travel to the ranks by value through @distributed. Only the
record of what Lightning decided comes from lightning_ddp.describe(). Reports the ranks'
records and the caller's pid (tests/py/test_framework_env.py)."""
import os
import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api_scripts"))
import _helpers  # noqa: E402
from airhost import distributed  # noqa: E402
from lightning_ddp import describe, regression_data  # noqa: E402


class NotebookRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


@distributed(num_accelerators=2, tracking=False)
def fit_on_every_rank(steps: int) -> dict:
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    torch.manual_seed(trainer.global_rank)
    model = NotebookRegressor()
    trainer.fit(model, regression_data())
    record = describe(trainer, model)
    record["module_class"] = type(model).__name__
    return record


if __name__ == "__main__":
    results = fit_on_every_rank.distributed(3)
    _helpers.report({"results": results, "caller_pid": os.getpid()})

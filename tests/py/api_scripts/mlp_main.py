"""The docs' example as a user's script: SimpleMLP and setup() are defined at module level
of __main__, outside the decorated function, which uses them; cloudpickle sends all three by
value. `python mlp_main.py` reports each rank's result (test_api_fanout.py)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import _helpers
from airhost import distributed

LEARNING_RATE = 0.05  # a module-level constant the function reads


class SimpleMLP(nn.Module):
    def __init__(self, input_dim=8, hidden_dim=16, output_dim=1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, output_dim))

    def forward(self, x):
        return self.net(x)


def setup():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), backend


@distributed(num_accelerators=2, tracking=False)
def run_train(num_epochs, batch_size):
    rank, world, backend = setup()
    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = DDP(SimpleMLP())
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(batch_size * 4, 8, generator=g)
    y = x.sum(dim=1, keepdim=True)
    loss = None
    for _ in range(num_epochs):
        for i in range(0, len(x), batch_size):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[i:i + batch_size]), y[i:i + batch_size])
            loss.backward()
            opt.step()
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "backend": backend, "loss": loss.item(), "checksum": checksum,
            "pid": os.getpid(), "model_class": type(model.module).__name__,
            "model_module": type(model.module).__module__}


if __name__ == "__main__":
    results = run_train.distributed(2, batch_size=8)
    local = run_train.fn  # still a plain function here
    _helpers.report({"results": results, "caller_pid": os.getpid(), "local_name": local.__name__})

"""airhost: run a PyTorch training function or script on every accelerator of a node.

    from airhost import distributed

    @distributed()
    def train(epochs: int) -> float:
        ...

    losses = train.distributed(epochs=3)   # one value per rank, in rank order
"""

__version__ = "0.1.0"

from ._accelerators import AcceleratorType, GPUType  # noqa: E402
from ._api import DistributedError, DistributedFunction, RunFuture, distributed  # noqa: E402
from ._jobs import Job  # noqa: E402
from ._preemption import Preempted, preemption_requested  # noqa: E402
from ._ray import ray_init  # noqa: E402

__all__ = ["distributed", "AcceleratorType", "GPUType", "DistributedError", "DistributedFunction", "RunFuture",
           "Job", "Preempted", "preemption_requested", "ray_init"]

"""An HF accelerate script as a user writes it for CPU training under torchrun (no airhost in
it). `cpu=True` is how accelerate is told to train on CPUs: without it, a CPU-only torch
makes accelerate report DistributedType.NO under torchrun too (see torchrun_parity.py).
Each process prints one `@@ENV@@ {json}` line (tests/py/test_framework_env.py)."""
import json
import os

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType

state = PartialState(cpu=True)
accelerator = Accelerator(cpu=True)
# Each rank contributes a value only it knows; gather must return all of them, in rank order.
gathered = accelerator.gather(torch.tensor([100 + state.process_index, os.getpid()]))
print("@@ENV@@ " + json.dumps({
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "process_index": state.process_index,
    "num_processes": state.num_processes,
    "local_process_index": state.local_process_index,
    "is_main_process": state.is_main_process,
    "distributed_type": str(state.distributed_type),
    "multi_cpu": state.distributed_type == DistributedType.MULTI_CPU,
    "backend": state.backend,
    "device": str(state.device),
    "accelerator_distributed_type": str(accelerator.distributed_type),
    "accelerator_num_processes": accelerator.num_processes,
    "gathered": gathered.tolist(),
}), flush=True)
accelerator.wait_for_everyone()
accelerator.end_training()  # destroys the process group

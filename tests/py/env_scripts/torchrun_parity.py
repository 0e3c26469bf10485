"""Prints what a rank sees of its launcher: its whole environment, and what HF accelerate
decides from it with no arguments (`PartialState()`). The same script runs under torchrun and
under airhost (tests/py/test_framework_env.py), which compares the two."""
import json
import os

from accelerate import PartialState

state = PartialState()
print("@@ENV@@ " + json.dumps({
    "environ": dict(os.environ),
    "accelerate": {
        "distributed_type": str(state.distributed_type),
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "local_process_index": state.local_process_index,
        "backend": state.backend,
    },
}), flush=True)

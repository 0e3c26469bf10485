"""A user's script that imports one of the examples and runs its train() through
`@distributed`, as the examples' docstrings show (test_frameworks.py):

    python import_example.py MODULE RANKS EPOCHS

The function travels by reference (module MODULE of examples/), so each rank imports the
example itself from the caller's sys.path, which airhost hands on. Reports the per-rank
results of train(details=True) as one JSON line (_helpers.report).
"""
import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "api_scripts"))
sys.path.insert(0, str(HERE.parent.parent.parent / "examples"))

import _helpers  # noqa: E402
from airhost import distributed  # noqa: E402

module_name, ranks, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
example = importlib.import_module(module_name)
results = distributed(num_accelerators=ranks)(example.train).distributed(num_epochs=epochs, details=True)
_helpers.report({"results": results, "caller_pid": os.getpid(), "module": example.__name__,
                 "module_file": example.__file__})

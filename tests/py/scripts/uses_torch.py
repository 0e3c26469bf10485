"""Imports torch and says where the interpreter and torch come from."""
import json
import sys

import torch

from emit import say

say(json.dumps({"executable": sys.executable, "prefix": sys.prefix, "torch_file": torch.__file__,
                "torch_version": torch.__version__}))

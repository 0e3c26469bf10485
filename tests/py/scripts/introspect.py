"""Prints one JSON line describing how Python runs this file (used with airhost and with
plain `python`, to compare the two). Standalone: tests copy it around."""
import json
import os
import sys

print(json.dumps({
    "rank": os.environ.get("RANK"),
    "name": __name__,
    "file": __file__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "executable": sys.executable,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "cwd": os.getcwd(),
}), flush=True)

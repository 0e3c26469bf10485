"""Writes the rank's whole environment as JSON to <cwd>/env/rank-<RANK>.json."""
import json
import os

from emit import RANK, say

os.makedirs("env", exist_ok=True)
with open(os.path.join("env", f"rank-{RANK}.json.tmp"), "w") as f:
    json.dump(dict(os.environ), f)
os.rename(os.path.join("env", f"rank-{RANK}.json.tmp"), os.path.join("env", f"rank-{RANK}.json"))
say(f"environment of rank {RANK} written")

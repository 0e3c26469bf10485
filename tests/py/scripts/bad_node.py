"""A rank of an elastic job where one node is bad (tests/py/test_elastic.py): on the host given
BAD_NODE=1 every rank exits 3 each attempt; elsewhere the ranks sum over a gloo group and print
"attempt A world W sum S"."""
import os
import sys
import time

import torch
import torch.distributed as dist

e = os.environ
attempt = int(e["TORCHELASTIC_RESTART_COUNT"])
if e.get("BAD_NODE") == "1":
    print(f"bad node, attempt {attempt}", flush=True)
    time.sleep(0.3)
    sys.exit(3)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"attempt {attempt} world {e['WORLD_SIZE']} sum {t.item():g}", flush=True)
dist.destroy_process_group()

"""An elastic job's rank that waits for its group to grow (tests/py/test_elastic.py): in a
group of fewer than WANT nodes' ranks it marks DIR/ready-ATTEMPT-RANK and loops in all_reduce
(until airhost stops it to take a node in); in a group of WANT ranks it sums and exits, and so
it does from attempt UNTIL_ATTEMPT on whatever the group's size, when given.

    airhost grow_until.py -n 1 --nnodes 2:3 ... -- DIR WANT [UNTIL_ATTEMPT]"""
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

d, want = Path(sys.argv[1]), int(sys.argv[2])
until_attempt = int(sys.argv[3]) if len(sys.argv) > 3 else None
e = os.environ
dist.init_process_group("gloo")
attempt, world = int(e["TORCHELASTIC_RESTART_COUNT"]), int(e["WORLD_SIZE"])
print(f"attempt {attempt} rank {e['RANK']} world {world} nodes {e['GROUP_WORLD_SIZE']} port {e['MASTER_PORT']}",
      flush=True)
t = torch.ones(1)
if world < want and (until_attempt is None or attempt < until_attempt):
    (d / f"ready-{attempt}-{e['RANK']}").touch()
    while True:
        dist.all_reduce(t)
        time.sleep(0.05)
dist.all_reduce(t)
print(f"sum {t.item():g}", flush=True)
dist.destroy_process_group()

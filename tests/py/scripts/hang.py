"""A hang, for `airhost stacks`: rank 0 waits in all_reduce while rank 1 is elsewhere.

    hang.py loop DIR   rank 1 loops in load_batch() until DIR/release exists
    hang.py c DIR      rank 1 sits in a C call that holds the GIL (libc sleep through
                       ctypes.PyDLL) in stuck_in_c(), until DIR/release exists
    hang.py wait DIR   rank 1 waits, idle, in wait_for_data() until DIR/release exists (a
                       hang: its stack and its CPU time stand still)

The odd rank is rank 1, or the one HANG_RANK names (rank 3 on the second of two nodes).
Each rank creates DIR/ready-RANK once the group is up; then all all-reduce and exit 0."""
import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist

MODE, DIR = sys.argv[1], sys.argv[2]
RELEASE = os.path.join(DIR, "release")


def load_batch():
    # Busy in this very frame (builtins only), looking for the release file 5 times a second.
    while True:
        until = time.monotonic() + 0.2
        while time.monotonic() < until:
            sum(range(1000))
        if os.path.exists(RELEASE):
            return


def stuck_in_c():
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held through the call
    while not os.path.exists(RELEASE):
        libc.sleep(2)  # a signal cuts it short (EINTR); the loop sleeps again


def wait_for_data():
    while not os.path.exists(RELEASE):
        time.sleep(0.2)


dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(DIR, f"ready-{rank}"), "w").close()
if rank == int(os.environ.get("HANG_RANK", "1")):
    {"loop": load_batch, "c": stuck_in_c, "wait": wait_for_data}[MODE]()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} sum={t.item():g}", flush=True)
dist.destroy_process_group()

"""A collective one rank never joins, with torch's flight recorder on (TORCH_FR_BUFFER_SIZE):
three all-reduces on every rank, then the ranks other than 1 enter a fourth while rank 1
loops in load_batch. The ranks' dumps go to <run_dir>/stacks/nccl-trace-rank-R, where NCCL's
watchdog writes them on a GPU node (gloo records, but has neither NCCL's dump on timeout nor
its monitor thread):

    fr_hang.py self   each rank writes its dump at once, as NCCL's watchdog does on a timeout
    fr_hang.py pipe   a stand-in for NCCL's monitor thread (named so: NCCL cannot run here)
                      makes <prefix>R.pipe as TORCH_NCCL_DEBUG_INFO_PIPE_FILE says and dumps
                      when a byte comes there, as that thread does

Then every rank waits: the run ends by airhost's --timeout or --on-hang stop."""
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

MODE = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
PREFIX = os.path.join(os.environ["AIRHOST_RUN_DIR"], "stacks", "nccl-trace-rank-")


def dump():
    path = f"{PREFIX}{rank}"
    with open(path + ".tmp", "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace())
    os.replace(path + ".tmp", path)
    print(f"rank {rank} dumped", flush=True)


def stand_in_for_nccl_monitor(pipe):
    # Blocked in read until a byte comes, so that a rank stuck is still (no CPU time): the host's
    # hang watch sees what it would see of a real rank. O_RDWR: the FIFO has a reader from the
    # start (a writer's O_NONBLOCK open would fail without one).
    fd = os.open(pipe, os.O_RDWR)
    while os.read(fd, 128):
        dump()


if MODE == "pipe":
    # The variable as airhost gives GPU ranks; this test sets it itself for its CPU ranks.
    pipe = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", PREFIX) + f"{rank}.pipe"
    os.mkfifo(pipe)
    threading.Thread(target=stand_in_for_nccl_monitor, args=(pipe,), daemon=True).start()

def load_batch():
    while True:
        time.sleep(0.1)


t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
if MODE == "self":
    threading.Timer(0.5, dump).start()  # once every rank is where it stays
print(f"rank {rank} waits", flush=True)
if rank == 1:
    load_batch()
dist.all_reduce(t)  # the fourth, which rank 1 never enters

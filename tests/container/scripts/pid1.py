"""A rank of tests/container/: says who its parent is, then exits with the code given for it.

    airhost pid1.py -n N -- [CODE_OF_RANK_0 CODE_OF_RANK_1 ...]"""
import os
import sys

rank = int(os.environ["RANK"])
codes = [int(c) for c in sys.argv[1:]]
print(f"rank {rank} of {os.environ['WORLD_SIZE']} parent {os.getppid()} host_pid {os.environ.get('AIRHOST_HOST_PID')}",
      flush=True)
sys.exit(codes[rank] if rank < len(codes) else 0)

"""One light rank of a job of many nodes (tests/py/test_scale.py): says it is up in DIR, then
waits; the job's last rank exits 1 once DIR/fail appears. No torch: what is tested is the hosts."""
import os
import sys
import time
from pathlib import Path

d = Path(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def wait_here():
    # Up once here: stacks taken after the stamp find this rank in this function.
    (d / f"up-{rank}.tmp").write_text(os.environ["GROUP_RANK"])
    os.replace(d / f"up-{rank}.tmp", d / f"up-{rank}")
    while not (d / "fail").exists():
        time.sleep(0.05)


wait_here()
if rank == world - 1:
    sys.exit(1)
while True:
    time.sleep(1)

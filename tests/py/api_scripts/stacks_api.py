"""Caller script of test_stacks.py: `python stacks_api.py future TMPDIR`: `.stacks()` on the
future of `.submit()` while rank 0 waits in all_reduce and rank 1 loops in load_batch."""
import os
import sys
import time

import _helpers
import airhost
from airhost import distributed


def hang(release):
    import torch
    import torch.distributed as dist

    def load_batch():
        # Busy in this very frame (builtins only), looking for the release file 5 times a second.
        while True:
            until = time.monotonic() + 0.2
            while time.monotonic() < until:
                sum(range(1000))
            if os.path.exists(release):
                return

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        load_batch()
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def scenario_future(tmp):
    release = os.path.join(tmp, "release")
    future = distributed(num_accelerators=2, tracking=False)(hang).submit(release)
    deadline = time.monotonic() + 60
    while True:
        try:
            data = future.stacks()
            if data["ranks"][0]["where"].endswith("in all_reduce"):
                break
        except ValueError:  # not running yet
            pass
        if time.monotonic() > deadline:
            raise SystemExit("rank 0 never waited in all_reduce")
        time.sleep(0.2)
    job = airhost.Job(os.path.basename(future._launch.run_dir))  # the same run, found by its id
    job_groups = job.stacks()["groups"]
    sampled = {"future": future.stacks(sample=0.5)["groups"], "job": job.stacks(sample=0.5)["groups"]}
    open(release, "w").close()
    results = future.result(timeout=60)
    after = {}
    for name, source in (("future", future), ("job", job)):
        try:
            source.stacks()
            after[name] = "no error"
        except ValueError as e:
            after[name] = f"ValueError: {e}"
    _helpers.report({"groups": data["groups"], "rank0": data["ranks"][0]["where"], "results": results,
                     "job_groups": job_groups, "sampled": sampled, "after": after})


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]](*sys.argv[2:])

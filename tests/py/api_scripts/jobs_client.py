"""A notebook's way with jobs, run as its own process: `jobs_client.py MODE [ARGS]` submits a
@distributed function as a job (or attaches to one) and prints one JSON line of what it got."""
import json
import os
import sys
import time

from airhost import DistributedError, Job, distributed


@distributed(num_accelerators=2)
def where(offset):
    rank = int(os.environ["RANK"])
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} on node {os.environ['GROUP_RANK']}", flush=True)
    return {"rank": rank, "value": rank + offset, "node": int(os.environ["GROUP_RANK"])}


@distributed(num_accelerators=2)
def fails_on_last():
    rank = int(os.environ["RANK"])
    if rank == int(os.environ["WORLD_SIZE"]) - 1:
        raise ArithmeticError(f"rank {rank} cannot go on")
    time.sleep(60)  # the others wait, as ranks in a collective would, until they are stopped
    return rank


@distributed(num_accelerators=2)
def sleeps():
    print("ready", flush=True)
    time.sleep(600)


def main():
    mode, to, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "where":
        job = where.job(to=to, nodes=nodes).submit(100)
        print(json.dumps({"run_id": job.run_id, "results": job.result(timeout=150), "state": job.state}), flush=True)
    elif mode == "submit-only":
        print(json.dumps({"run_id": where.job(to=to, nodes=nodes).submit(7).run_id}), flush=True)
    elif mode == "attach":
        job = Job(sys.argv[4])
        print(json.dumps({"run_id": job.run_id, "results": job.result(timeout=150)}), flush=True)
    elif mode == "fails":
        job = fails_on_last.job(to=to, nodes=nodes).submit()
        try:
            job.result(timeout=150)
            print(json.dumps({"raised": None}))
        except DistributedError as e:
            print(json.dumps({"raised": "DistributedError", "message": str(e), "failed": e.failed_ranks,
                              "cause": type(e.__cause__).__name__, "state": job.state}), flush=True)
    elif mode == "cancel":
        job = sleeps.job(to=to, nodes=nodes).submit()
        deadline = time.monotonic() + 90
        while "ready" not in job.logs(rank=1) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(json.dumps({"run_id": job.run_id, "state": job.cancel()}), flush=True)
    elif mode == "bad-slurm-key":
        try:
            where.job(to=to, nodes=nodes, partitoin="gpu")
        except TypeError as e:
            print(json.dumps({"raised": "TypeError", "message": str(e)}))
    elif mode == "refused":
        try:
            where.job(to=to, nodes=nodes, partition="no_such_partition").submit(1)
        except ValueError as e:
            print(json.dumps({"raised": "ValueError", "message": str(e)}))


if __name__ == "__main__":
    main()

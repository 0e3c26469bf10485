"""What each rank uses, seen from the host (host/launch/rank_usage.hpp): CPU and memory of every
rank every 5 s into <run_dir>/metrics/ranks.jsonl, into the launch's MLflow run as system
metrics per rank, and into the report when the timeout ends a run, naming a rank idle while
the others are busy. Real ranks, real /proc, real MLflow."""
import json

import pytest

# Rank 0 computes, rank 1 sleeps, for SECONDS (or until the timeout stops them).
BUSY_AND_IDLE = (
    "import os, sys, time\n"
    "rank, until = int(os.environ['RANK']), time.monotonic() + float(sys.argv[1])\n"
    "a = [0] * 100000 if rank == 0 else None\n"
    "while time.monotonic() < until:\n"
    "    if rank == 0:\n"
    "        sum(range(10000))\n"
    "    else:\n"
    "        time.sleep(0.2)\n"
)


def series(run_dir):
    lines = (run_dir / "metrics" / "ranks.jsonl").read_text().splitlines()
    by_rank = {}
    for line in lines:
        u = json.loads(line)
        by_rank.setdefault(u["rank"], []).append(u)
    return by_rank


@pytest.mark.timeout(120)
def test_each_ranks_cpu_and_memory_are_kept_every_few_seconds(airhost, work):
    (work / "busy.py").write_text(BUSY_AND_IDLE)
    run = airhost(str(work / "busy.py"), "-n", "2", "--", "12", cwd=work)
    run.assert_rc(0)
    by_rank = series(run.run_dir)
    assert sorted(by_rank) == [0, 1], by_rank
    for rank, samples in by_rank.items():
        assert len(samples) >= 2, samples  # one every 5 s over 12 s
        assert samples[0]["cpu_percent"] is None  # the first has nothing to measure against
        assert all(s["rss_bytes"] > 10 << 20 for s in samples), samples  # a Python interpreter, at least
        assert all(s["node"] == 0 for s in samples)
    busy = max(s["cpu_percent"] for s in by_rank[0][1:])
    idle = max(s["cpu_percent"] for s in by_rank[1][1:])
    assert busy > 50 and idle < 20, (busy, idle)


@pytest.mark.timeout(120)
def test_the_timeout_report_names_a_rank_idle_while_the_others_are_busy(airhost, work):
    (work / "busy.py").write_text(BUSY_AND_IDLE)
    run = airhost(str(work / "busy.py"), "-n", "2", "--timeout", "12", "--", "600", cwd=work)
    run.assert_rc(124)
    line = next((x for x in run.err.splitlines() if "what each rank used" in x), None)
    assert line is not None, run.describe()
    assert "rank 0 " in line and "rank 1 0% " in line, line
    assert line.endswith("Rank 1 is idle while rank 0 is busy"), line


@pytest.mark.timeout(240)
def test_the_mlflow_run_holds_each_ranks_cpu_and_memory(airhost, work, tmp_path):
    pytest.importorskip("mlflow")
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "usage"}
    (work / "busy.py").write_text(BUSY_AND_IDLE)
    run = airhost(str(work / "busy.py"), "-n", "2", "--", "12", cwd=work, env=env, timeout=200)
    run.assert_rc(0)
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient()
    [found] = client.search_runs([client.get_experiment_by_name("usage").experiment_id])
    assert found.info.status == "FINISHED"
    kept = series(run.run_dir)
    for rank in (0, 1):
        cpu = client.get_metric_history(found.info.run_id, f"system/rank_{rank}/cpu_utilization_percentage")
        mem = client.get_metric_history(found.info.run_id, f"system/rank_{rank}/memory_rss_megabytes")
        assert len(mem) == len(kept[rank]) and len(cpu) == len(kept[rank]) - 1, (rank, cpu, mem)
        assert all(m.value > 10 for m in mem), mem
    assert max(m.value for m in client.get_metric_history(found.info.run_id, "system/rank_0/cpu_utilization_percentage")) > 50

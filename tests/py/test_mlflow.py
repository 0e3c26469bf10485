"""Python API and MLflow (real MLflow, a sqlite store in the test's tmp directory): each
`.distributed()` call is an MLflow run, nested under the active run, that every rank's
mlflow.log_metric lands in, and that ends FINISHED, FAILED or KILLED by the outcome."""
from __future__ import annotations

import signal
import time
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import Background, base_env, mlflow_uri, run_dirs, run_scenario  # noqa: E402

EXPERIMENT = "airhost-api-tests"


def mlflow_env(tmp, experiment=EXPERIMENT):
    extra = {"MLFLOW_EXPERIMENT_NAME": experiment} if experiment else {}
    return base_env(tmp, mlflow=True, extra=extra)


def runs_of(tmp, experiment=EXPERIMENT):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri(tmp))
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} in {mlflow_uri(tmp)}"
    return client, client.search_runs([exp.experiment_id])


def airhost_runs(tmp, function_name, experiment=EXPERIMENT):
    client, runs = runs_of(tmp, experiment)
    return client, [r for r in runs if r.info.run_name == function_name]


def no_database_locked(tmp, *texts):
    for text in texts:
        assert "database is locked" not in text
    for d in run_dirs(tmp):
        for log in (d / "logs").glob("*.log"):
            assert b"database is locked" not in log.read_bytes(), log


@pytest.mark.timeout(120)
def test_a_distributed_call_is_a_finished_mlflow_run_in_the_experiment_of_mlflow_experiment_name(api_tmp):
    caller = run_scenario(api_tmp, "mlflow_calls.py", "basic", env=mlflow_env(api_tmp), timeout=100).ok()
    assert caller.result["results"] == [0, 1]
    client, runs = airhost_runs(api_tmp, "log_one")
    assert len(runs) == 1, runs
    run = runs[0]
    assert run.info.status == "FINISHED"
    # The ranks' own metrics (a call that lasts 5 s or more also has the host's system/ ones).
    assert {k: v for k, v in run.data.metrics.items() if not k.startswith("system/")} == {
        "rank0_metric": 0.5, "rank1_metric": 1.5}
    assert run.data.params["num_accelerators"] == "2"
    assert "mlflow.parentRunId" not in run.data.tags
    # The caller was told where the run is.
    hint = next((line for line in caller.err.splitlines() if run.info.run_id in line), None)
    assert hint is not None, f"the run id was not printed\n{caller.describe()}"
    assert f"mlflow ui --backend-store-uri {mlflow_uri(api_tmp)}" in hint, hint


@pytest.mark.timeout(120)
def test_without_mlflow_experiment_name_the_run_goes_to_the_airhost_experiment(api_tmp):
    env = mlflow_env(api_tmp, experiment=None)
    caller = run_scenario(api_tmp, "mlflow_calls.py", "tracked_quiet", env=env, timeout=100).ok()
    assert caller.result["results"] == [0, 1]
    _, runs = airhost_runs(api_tmp, "log_nothing", experiment="airhost")
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert runs[0].data.params["function"] == "log_nothing"


@pytest.mark.timeout(120)
def test_a_call_under_an_active_run_is_its_child_and_the_parent_stays_active(api_tmp):
    out = run_scenario(api_tmp, "mlflow_calls.py", "nested", env=mlflow_env(api_tmp), timeout=100).ok().result
    client, runs = airhost_runs(api_tmp, "log_one")
    assert len(runs) == 1
    child = runs[0]
    assert child.data.tags.get("mlflow.parentRunId") == out["parent"]
    assert child.info.status == "FINISHED"
    # What the ranks logged; the host's samples of each rank (system/rank_N/...) come on top
    # when the call lasts past a sampling (every 5 s: a loaded machine).
    assert {m for m in child.data.metrics if not m.startswith("system/")} == {"rank0_metric", "rank1_metric"}
    assert out["active_after"] == out["parent"], "the parent run is no longer the active run"
    parent = client.get_run(out["parent"])
    assert parent.info.status == "FINISHED" and not parent.data.metrics


@pytest.mark.timeout(300)
def test_four_ranks_logging_500_steps_each_land_all_2000_points_without_database_locked(api_tmp):
    caller = run_scenario(api_tmp, "mlflow_calls.py", "many", "4", "500", env=mlflow_env(api_tmp), timeout=280).ok()
    assert caller.result["results"] == [0, 1, 2, 3]
    client, runs = airhost_runs(api_tmp, "log_many")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    total = 0
    for rank in range(4):
        history = client.get_metric_history(run.info.run_id, f"loss_rank{rank}")
        assert sorted(m.step for m in history) == list(range(500)), f"rank {rank}: {len(history)} points"
        total += len(history)
    assert total == 2000
    no_database_locked(api_tmp, caller.out, caller.err)


@pytest.mark.timeout(120)
def test_a_rank_raising_marks_the_run_failed(api_tmp):
    err = run_scenario(api_tmp, "mlflow_calls.py", "fails", env=mlflow_env(api_tmp), timeout=100).ok().result
    assert err["type"] == "DistributedError", err
    _, runs = airhost_runs(api_tmp, "fails")
    assert [r.info.status for r in runs] == ["FAILED"]


@pytest.mark.timeout(120)
def test_an_interrupted_call_marks_the_run_killed(api_tmp):
    caller = Background(api_tmp, [_helpers.script("mlflow_calls.py"), "sigint"], env=mlflow_env(api_tmp))
    try:
        caller.wait_output(["[rank 0] started", "[rank 1] started"], timeout=90)
        sent = time.time()
        caller.signal(signal.SIGINT)
        # The ranks never touched MLflow, so the run is made only now (mlflow imported, a fresh
        # database migrated): the caller's exit waits for it, the KeyboardInterrupt does not.
        done = caller.finish(timeout=90).ok()
    finally:
        caller.kill()
    assert done.result["raised"] == "KeyboardInterrupt", done.result
    assert done.result["at"] - sent < 8, f"KeyboardInterrupt came {done.result['at'] - sent:.1f} s after SIGINT"
    _, runs = airhost_runs(api_tmp, "sleeps")
    assert [r.info.status for r in runs] == ["KILLED"]


@pytest.mark.timeout(120)
def test_tracking_false_creates_no_run(api_tmp):
    caller = run_scenario(api_tmp, "mlflow_calls.py", "untracked", env=mlflow_env(api_tmp), timeout=100).ok()
    assert caller.result["results"] == [0, 1]
    assert not (api_tmp / "mlflow.db").exists() or runs_of(api_tmp)[1] == []
    assert "MLflow" not in caller.err
    assert not (api_tmp / "mlruns").exists()


@pytest.mark.timeout(150)
def test_a_call_holds_each_ranks_cpu_and_memory_sampled_by_the_host(api_tmp):
    out = run_scenario(api_tmp, "mlflow_calls.py", "busy", "12", env=mlflow_env(api_tmp), timeout=120).ok().result
    assert out["results"] == [0, 1]
    client, runs = airhost_runs(api_tmp, "busy")
    assert len(runs) == 1, runs
    run_id = runs[0].info.run_id
    for rank in (0, 1):
        mem = client.get_metric_history(run_id, f"system/rank_{rank}/memory_rss_megabytes")
        assert len(mem) >= 2 and all(m.value > 10 for m in mem), (rank, mem)
    cpu0 = client.get_metric_history(run_id, "system/rank_0/cpu_utilization_percentage")
    cpu1 = client.get_metric_history(run_id, "system/rank_1/cpu_utilization_percentage")
    assert cpu0 and cpu1 and max(m.value for m in cpu0) > 50 and max(m.value for m in cpu1) < 20, (cpu0, cpu1)

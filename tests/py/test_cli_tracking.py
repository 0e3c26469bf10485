"""`airhost train.py` makes an MLflow run per launch, like `.distributed()` does (real MLflow)."""
import os
import sys

import pytest

pytest.importorskip("mlflow")

LOGGER = (
    "import os, sys, mlflow\n"
    "rank = int(os.environ['RANK'])\n"
    "for step in range(100):\n"
    "    mlflow.log_metric(f'loss_{rank}', 1.0 / (step + 1), step=step)\n"
    "if 'fail' in sys.argv and rank == 1:\n"
    "    raise ValueError('rank 1 gives up')\n"
)


def _runs(uri, experiment):
    import mlflow

    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


@pytest.mark.timeout(240)
def test_a_launch_is_one_mlflow_run_holding_every_ranks_metrics_and_ending_by_the_outcome(airhost, work, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "cli-test"}
    (work / "log.py").write_text(LOGGER)

    ok = airhost(str(work / "log.py"), "-n", "2", cwd=work, env=env, timeout=200)
    ok.assert_rc(0)
    assert "airhost: MLflow run " in ok.err and "mlflow ui --backend-store-uri" in ok.err
    client, runs = _runs(uri, "cli-test")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["num_accelerators"] == "2"
    for rank in range(2):
        assert len(client.get_metric_history(run.info.run_id, f"loss_{rank}")) == 100

    failed = airhost(str(work / "log.py"), "-n", "2", "--", "fail", cwd=work, env=env, timeout=200)
    failed.assert_rc(1)
    _, runs = _runs(uri, "cli-test")
    statuses = sorted(r.info.status for r in runs)
    assert statuses == ["FAILED", "FINISHED"], statuses


@pytest.mark.timeout(120)
def test_no_tracking_makes_no_run(airhost, work, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (work / "log.py").write_text("print('hi')\n")
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "cli-off"}
    run = airhost(str(work / "log.py"), "-n", "1", "--no-tracking", cwd=work, env=env)
    run.assert_rc(0)
    assert "MLflow" not in run.err
    _, runs = _runs(uri, "cli-off")
    assert runs == []


@pytest.mark.timeout(240)
def test_on_a_sqlite_store_the_ranks_sql_writes_retry_instead_of_losing_points_to_database_is_locked(
    airhost, work, tmp_path
):
    """SQLite answers "database is locked" at once when two writers upgrade together; airhost
    makes the SQL store of the ranks retry (runtime/bootstrap.py). This checks the retry is
    in place in a rank, and that it is not on other stores."""
    (work / "probe.py").write_text(
        "import mlflow\n"
        "mlflow.log_metric('x', 1.0)\n"
        "from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as S\n"
        "print('retrying', all(hasattr(getattr(S, m), '__wrapped__') for m in ('log_metric', 'log_batch')))\n"
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "retry"}
    run = airhost(str(work / "probe.py"), "-n", "1", cwd=work, env=env, timeout=200)
    run.assert_rc(0)
    assert b"retrying True" in run.log(0)

    off = airhost(str(work / "probe.py"), "-n", "1", "--no-tracking", cwd=work,
                  env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "retry"}, timeout=200)
    off.assert_rc(0)
    assert b"retrying False" in off.log(0)


@pytest.mark.timeout(60)
def test_a_launch_refused_for_bad_input_makes_no_mlflow_run(airhost, work, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "refused"}
    run = airhost(str(work / "missing.py"), "-n", "1", cwd=work, env=env)
    run.assert_rc(2)
    assert "not found" in run.err and "MLflow" not in run.err
    _, runs = _runs(uri, "refused")
    assert runs == []

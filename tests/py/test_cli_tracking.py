"""`airhost train.py` makes an MLflow run per launch, like `.distributed()` does (real MLflow)."""
import os
import signal
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


# ---- the run is made beside the ranks' start, not before it --------------------------------------

BINDER = (
    "import os, sys\n"
    "before = {k: os.environ.get(k) for k in ('MLFLOW_RUN_ID', 'AIRHOST_MLFLOW_PENDING')}\n"
    "print('before', before['MLFLOW_RUN_ID'], bool(before['AIRHOST_MLFLOW_PENDING']), 'mlflow' in sys.modules)\n"
    "import importlib.util\n"
    "assert importlib.util.find_spec('mlflow') is not None\n"  # a probe binds nothing
    "print('probed', os.environ.get('MLFLOW_RUN_ID'))\n"
    "import mlflow\n"
    "print('after', os.environ.get('MLFLOW_RUN_ID'))\n"
    "mlflow.log_metric('bound', 1.0)\n"
)


@pytest.mark.timeout(200)
def test_a_rank_binds_the_launchs_run_when_it_imports_mlflow_and_not_before(airhost, work, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "bind"}
    (work / "bind.py").write_text(BINDER)
    run = airhost(str(work / "bind.py"), "-n", "2", cwd=work, env=env, timeout=180)
    run.assert_rc(0)
    client, runs = _runs(uri, "bind")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run_id = runs[0].info.run_id
    for rank in range(2):
        log = run.log(rank).decode()
        assert "before None True False" in log, log  # the rank started without waiting for the run
        assert "probed None" in log, log
        assert f"after {run_id}" in log, log
    assert client.get_metric_history(run_id, "bound")
    assert (run.run_dir / "tracking.env").read_text().startswith(f"MLFLOW_RUN_ID={run_id}\n")


@pytest.mark.timeout(200)
def test_without_a_tracking_uri_the_cli_keeps_its_mlflow_database_in_the_state_dir_not_the_cwd(
    airhost, work, tmp_path
):
    state = tmp_path / "state"
    (work / "log.py").write_text("import mlflow\nmlflow.log_metric('m', 2.0)\n")
    run = airhost(str(work / "log.py"), "-n", "1", cwd=work, timeout=180,
                  env={"AIRHOST_TRACKING": "1", "XDG_STATE_HOME": str(state), "MLFLOW_EXPERIMENT_NAME": "state"},
                  unset_env=("MLFLOW_TRACKING_URI",))
    run.assert_rc(0)
    assert not (work / "mlflow.db").exists() and not (work / "mlruns").exists(), sorted(p.name for p in work.iterdir())
    db = state / "airhost" / "mlflow.db"
    assert db.is_file()
    assert f"mlflow ui --backend-store-uri sqlite:///{db}" in run.err
    client, runs = _runs(f"sqlite:///{db}", "state")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert client.get_metric_history(runs[0].info.run_id, "m")[0].value == 2.0


@pytest.mark.timeout(200)
def test_a_sigkilled_host_leaves_its_mlflow_run_killed_not_running(airhost, work, tmp_path):
    import time

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (work / "sleep.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    host = airhost.start(str(work / "sleep.py"), "-n", "1", cwd=work,
                         env={"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "killed"})
    run_dir = host.run_dir()
    deadline = time.monotonic() + 120
    while not (run_dir / "tracking.env").exists():
        assert time.monotonic() < deadline, "no MLflow run was made"
        time.sleep(0.1)
    host.signal(signal.SIGKILL)
    host.finish(timeout=30, check_processes=False)
    statuses = []
    while time.monotonic() < deadline:  # the helper reads EOF and sets the status
        _, runs = _runs(uri, "killed")
        statuses = [r.info.status for r in runs]
        if statuses == ["KILLED"]:
            break
        time.sleep(0.2)
    assert statuses == ["KILLED"], statuses


@pytest.mark.timeout(120)
def test_a_tracking_store_that_fails_is_said_once_and_the_ranks_train_without_it(airhost, work):
    (work / "log.py").write_text("import mlflow, os\nprint('run id', os.environ.get('MLFLOW_RUN_ID'))\n")
    run = airhost(str(work / "log.py"), "-n", "2", cwd=work, timeout=100,
                  env={"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": "bogus-scheme://nowhere"})
    run.assert_rc(0)
    assert run.err.count("airhost: mlflow is installed but no run could be created (") == 1, run.err
    assert "training without tracking" in run.err
    for rank in range(2):
        assert b"run id None" in run.log(rank)

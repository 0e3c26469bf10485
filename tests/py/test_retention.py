"""Run directories that do not pile up: `airhost runs prune` by hand, the retention policy
applied as each launch and each `.distributed()` call ends, `airhost runs keep`, and what is
never removed (a live run, a kept one). Real launches, real run directories."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import script, wait_for
from test_runs import Runs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def runs(airhost, tmp_path) -> Runs:
    return Runs(airhost, tmp_path)


def launch(runs: Runs, env=None) -> str:
    done = runs(script("hello.py"), "-n", "1", env=env)
    assert done.returncode == 0, done.stderr
    return [r["run_id"] for r in runs.listed()][0]


def ids(runs: Runs) -> set:
    return {p.name for p in runs.root.iterdir() if p.is_dir()}


def test_prune_removes_what_the_bounds_say_and_never_a_live_or_kept_run(runs):
    made = [launch(runs) for _ in range(4)]  # oldest first
    kept = made[0]
    assert runs("runs", "keep", kept).returncode == 0
    live = runs.start(script("sleeper.py"), "-n", "1", "--", "--sleep", "60")
    try:
        wait_for(lambda: any(r["state"] == "running" for r in runs.listed()), 30, "the live run")
        [live_id] = [r["run_id"] for r in runs.listed() if r["state"] == "running"]

        dry = runs("runs", "prune", "--keep", "1", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert ids(runs) == set(made) | {live_id}  # a dry run removes nothing
        # The newest run (the live one) stays; the kept one stays; the other three go.
        for gone in made[1:]:
            assert f"would remove {gone} " in dry.stdout, dry.stdout
        assert kept not in dry.stdout and live_id not in dry.stdout

        done = runs("runs", "prune", "--keep", "1")
        assert done.returncode == 0, done.stderr
        assert "removed 3 run(s)" in done.stdout and "freed" in done.stdout, done.stdout
        assert "mlflow gc" in done.stderr
        assert ids(runs) == {kept, live_id}

        # Size and age bounds: nothing is left that may go.
        assert "removed 0 run(s)" in runs("runs", "prune", "--max-size", "1K", "--older-than", "1s").stdout
        assert ids(runs) == {kept, live_id}
    finally:
        live.send_signal(signal.SIGTERM)
        live.wait(timeout=30)
    assert runs("runs", "keep", kept, "--undo").returncode == 0
    assert "removed 2 run(s)" in runs("runs", "prune", "--keep", "0").stdout
    assert ids(runs) == set()


def test_each_launch_applies_the_policy_when_it_ends(runs):
    for _ in range(3):
        launch(runs, env={"AIRHOST_RETENTION": "keep=2"})
    done = runs(script("hello.py"), "-n", "1", env={"AIRHOST_RETENTION": "keep=2"})
    assert done.returncode == 0 and "airhost: pruned 1 old run(s) of " in done.stderr, done.stderr
    assert "beyond the newest 2 runs" in done.stderr and "AIRHOST_RETENTION=off" in done.stderr
    assert len(ids(runs)) == 2
    for _ in range(3):
        launch(runs, env={"AIRHOST_RETENTION": "off"})
    assert len(ids(runs)) == 5
    # The defaults (30 days, 1000 runs, 20 GiB) remove nothing of a fresh root.
    launch(runs)
    assert len(ids(runs)) == 6


def test_a_config_file_sets_the_policy_and_bad_bounds_are_one_line(runs):
    (runs.cwd / "airhost.toml").write_text('retention = "keep=1"\n')
    for _ in range(2):
        launch(runs)
    assert len(ids(runs)) == 1
    (runs.cwd / "airhost.toml").write_text('retention = "keep=lots"\n')
    bad = runs(script("hello.py"), "-n", "1")
    assert bad.returncode == 2 and "airhost.toml:1:" in bad.stderr and "keep" in bad.stderr, bad.stderr
    (runs.cwd / "airhost.toml").unlink()
    for args in (["--older-than", "1x"], ["--max-size", "lots"], ["--frobnicate"]):
        done = runs("runs", "prune", *args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    env_bad = runs(script("hello.py"), "-n", "1", env={"AIRHOST_RETENTION": "forever"})
    assert env_bad.returncode == 0 and "AIRHOST_RETENTION" in env_bad.stderr and "no run directory was pruned" in env_bad.stderr


def test_a_distributed_call_prunes_old_runs_after_it_ends(runs):
    for _ in range(3):
        launch(runs, env={"AIRHOST_RETENTION": "off"})
    code = ("from airhost import distributed\n"
            "@distributed(num_accelerators=1)\n"
            "def f():\n    return 1\n"
            "print(f.distributed())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=runs.cwd, env={**runs.env, "AIRHOST_RETENTION": "keep=1"},
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and "[1]" in done.stdout, done.stderr
    wait_for(lambda: len(ids(runs)) == 1, 20, "the old runs to be pruned")
    [left] = ids(runs)
    assert runs.record(left)["entry"]["kind"] == "pickled"  # the call's own run stays

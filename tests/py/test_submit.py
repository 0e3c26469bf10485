"""`airhost submit --to local`: a run detached from the terminal that submitted it (a session of
its own, stdin from /dev/null, its console in the run directory), listed, read and cancelled
like any run; `--watch` follows it and exits with its exit code, and a signal to the watcher
(Ctrl-C, the terminal's hangup) stops the watching, never the run. Real hosts, real signals."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import script, wait_for, wait_until_gone, is_running
from test_runs import Runs, one_line

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def runs(airhost, tmp_path) -> Runs:
    return Runs(airhost, tmp_path)


def state_of(runs: Runs, run_id: str) -> str:
    try:
        return runs.record(run_id)["state"]
    except FileNotFoundError:
        return "starting"


def test_submit_prints_the_run_id_at_once_and_the_run_goes_on_without_it(runs):
    t0 = time.monotonic()
    done = runs("submit", "--to", "local", script("sleeper.py"), "-n", "2", "--", "--sleep", "2")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 10
    run_id = done.stdout.strip()
    assert len(done.stdout.splitlines()) == 1 and (runs.root / run_id).is_dir()
    assert f"submitted run {run_id}" in done.stderr
    live = wait_for(lambda: runs.record(run_id)["state"] == "running" and runs.record(run_id), 15, "running")
    # The host is in a session of its own, reading /dev/null, writing into the run directory.
    host = live["host_pid"]
    assert os.getsid(host) == host
    assert os.readlink(f"/proc/{host}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{host}/fd/1") == str(runs.root / run_id / "console.log")
    wait_for(lambda: state_of(runs, run_id) == "succeeded", 60, "the run to succeed")
    assert not wait_until_gone(run_id=run_id, timeout=5)
    console = (runs.root / run_id / "console.log").read_text()
    assert "[rank 1] rank 1 woke up" in console and "2 rank(s) succeeded" in console
    assert runs("logs", run_id, "--rank", "0").stdout.splitlines() == ["rank 0 ready", "rank 0 woke up"]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_submitting_session_stops_the_watching_not_the_run(runs, sig):
    # The submitter in a session of its own, as in a terminal: the terminal's hangup (SIGHUP)
    # or Ctrl-C (SIGINT) reaches its whole process group.
    watcher = subprocess.Popen([runs.airhost.binary, "submit", "--to", "local", "--watch", script("sleeper.py"), "-n", "2",
                                "--", "--sleep", "3"], cwd=runs.cwd, env=runs.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_dir = runs.only_dir()
    run_id = run_dir.name
    live = wait_for(lambda: state_of(runs, run_id) == "running" and runs.record(run_id), 15, "running")
    wait_for(lambda: "rank 1 ready" in (run_dir / "console.log").read_text(), 30, "the ranks to start")
    os.killpg(watcher.pid, sig)
    out, err = watcher.communicate(timeout=10)
    assert watcher.returncode == 128 + sig
    assert f"stopped watching; run {run_id} goes on" in err
    assert "rank 1 ready" in out
    assert is_running(live["host_pid"])
    wait_for(lambda: state_of(runs, run_id) == "succeeded", 60, "the run to succeed after all")
    assert runs.record(run_id)["exit_code"] == 0


def test_watch_follows_the_run_and_exits_with_its_exit_code(runs):
    done = runs("submit", "--to", "local", "--watch", script("fail.py"), "-n", "2", "--", "--how", "exit", "--code", "3")
    assert done.returncode == 3, done.stderr
    assert "Ctrl-C stops watching, not the run" in done.stderr
    assert "[rank 0] rank 0 ready" in done.stdout and "exited with code 3" in done.stdout
    [listed] = runs.listed()
    assert (listed["state"], listed["exit_code"]) == ("failed", 3)


def test_a_submitted_run_is_cancelled_like_any_other(runs):
    done = runs("submit", "--to", "local", script("sleeper.py"), "-n", "2")
    run_id = done.stdout.strip()
    wait_for(lambda: "rank 1 ready" in runs("logs", run_id).stdout, 30, "the ranks to start")
    cancel = runs("cancel", run_id)
    assert cancel.returncode == 0, cancel.stderr
    assert runs.record(run_id)["state"] == "cancelled"
    assert not wait_until_gone(run_id=run_id, timeout=5)


def test_bad_input_is_refused_before_anything_is_submitted(runs):
    missing = runs("submit", "--to", "local", "no_such_script.py")
    assert missing.returncode == 2
    assert "script 'no_such_script.py' not found" in missing.stderr
    assert not runs.root.exists() or not any(runs.root.iterdir())
    flag = runs("submit", "--to", "local", script("hello.py"), "--bogus")
    assert flag.returncode == 2 and "unknown flag '--bogus'" in flag.stderr
    where = runs("submit", "--to", "mars", script("hello.py"))
    assert where.returncode == 2 and "--to takes local or slurm" in one_line(where.stderr)
    nodes = runs("submit", "--to", "local", "--nodes", "2", script("hello.py"))
    assert nodes.returncode == 2 and "this node only" in one_line(nodes.stderr)
    no_slurm = runs("submit", "--to", "slurm", script("hello.py"), env={"PATH": "/nonexistent"})
    assert no_slurm.returncode == 2 and "needs sbatch on PATH" in one_line(no_slurm.stderr)
    assert not runs.root.exists() or not any(runs.root.iterdir())


def test_the_target_is_slurm_where_sbatch_is_on_path_and_local_elsewhere(runs, tmp_path):
    local = runs("submit", "--dry-run", script("hello.py"), "-n", "2", env={"PATH": "/nonexistent"})
    assert local.returncode == 0, local.stderr
    assert "in a session of its own" in local.stdout and "'-n' '2'" in local.stdout
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho should not run >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    (runs.cwd / "airhost.toml").write_text('[slurm]\npartition = "gpu"\n')
    slurm = runs("submit", "--dry-run", "--nodes", "2", "--time", "30", "--sbatch", "--exclusive", script("hello.py"),
                 "--", "a b", env={"PATH": str(fake)})
    assert slurm.returncode == 0, slurm.stderr
    lines = slurm.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=gpu", "#SBATCH --time=30",
                 "#SBATCH --exclusive"):
        assert line in lines, slurm.stdout
    assert lines[-1].endswith(f"'{script('hello.py')}' '--' 'a b'")
    assert not runs.root.exists() or not any(runs.root.iterdir())  # a dry run submits nothing
    (runs.cwd / "airhost.toml").write_text('[slurm]\npartitoin = "gpu"\n')
    typo = runs("submit", "--dry-run", script("hello.py"), env={"PATH": str(fake)})
    assert typo.returncode == 2 and "airhost.toml:2:1: unknown key 'slurm.partitoin'" in typo.stderr


def test_a_node_of_a_slurm_job_that_cannot_see_the_run_directory_says_so_and_starts_nothing(airhost):
    """What each node's airhost of a submitted Slurm job checks first. The job's environment
    (SLURM_JOB_ID and the run id its batch script exports) is set by hand here: a node that
    cannot see the runs root cannot be made with the test's Slurm, whose nodes share this
    machine's file system."""
    env = {"SLURM_JOB_ID": "4242", "AIRHOST_SUBMIT_RUN_ID": "20261205-000000-abcdef"}
    run = airhost(script("hello.py"), "-n", "1", env=env)
    run.assert_rc(2)
    assert "its directory" in run.err and "is not on this node" in run.err and "AIRHOST_RUNS_DIR" in run.err, run.err
    assert "hello from rank" not in run.out


@pytest.mark.skipif(not __import__("shutil").which("sbatch") or os.path.exists("/etc/slurm/slurm.conf"),
                    reason="needs sbatch installed with no Slurm configured, as on this test machine")
def test_sbatch_without_a_slurm_to_reach_says_so_and_offers_to_run_here(runs):
    # #33 item 7: sbatch installed, no Slurm configured: it said to fix a [slurm] setting.
    env = {k: v for k, v in runs.env.items() if not k.startswith("SLURM_")}
    done = subprocess.run([runs.airhost.binary, "submit", "--to", "slurm", script("hello.py")], cwd=runs.cwd, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("airhost: Slurm is not reachable from this machine: sbatch is installed, but says \""), line
    assert "--to local" in line and "[slurm] setting" not in line, line
    assert not runs.root.exists() or not any(runs.root.iterdir())


def test_ctrl_backslash_on_a_watch_prints_the_runs_stacks_and_watching_goes_on(runs):
    # #33 item 9: Ctrl-\ killed the watcher (SIGQUIT's default) instead of showing the stacks.
    watcher = subprocess.Popen([runs.airhost.binary, "submit", "--to", "local", "--watch", script("sleeper.py"), "-n", "2",
                                "--", "--sleep", "4"], cwd=runs.cwd, env=runs.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_dir = runs.only_dir()
    wait_for(lambda: "rank 1 ready" in (run_dir / "console.log").read_text(), 30, "the ranks to start")
    time.sleep(0.5)  # the ranks watch for stacks requests once their code runs
    os.killpg(watcher.pid, signal.SIGQUIT)
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err  # watched to the end, the run's exit code
    assert f"stacks of run {run_dir.name}: 2 ranks" in err, err
    assert "rank 1 ready" in out

"""`airhost submit --to slurm` with the real Slurm that test_slurm.py starts (two slurmd nodes in
network namespaces of their own where this machine allows it, else one): the batch script,
a job watched to its end, listed, its logs read per node and rank, a job cancelled with
nothing of it left, and sbatch's own refusal passed on."""
import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from conftest import script, wait_for, wait_until_gone
from test_slurm import DAEMONS, MISSING, slurm, which  # noqa: F401  (the module's cluster fixture)

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed ({', '.join(MISSING)} missing)"),
]


class Submitter:
    def __init__(self, cluster, airhost):
        self.binary = airhost.binary
        self.cwd = airhost.work
        self.root = airhost.tmp_path / "runs"
        self.env = {**airhost.env(self.root), "SLURM_CONF": cluster.env["SLURM_CONF"], "PATH": cluster.env["PATH"]}
        for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES"):
            self.env.pop(name, None)

    def __call__(self, *args, timeout=150) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, *map(str, args)], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def listed(self) -> list[dict]:
        return json.loads(self("runs", "--json").stdout)


@pytest.fixture
def submit(slurm, airhost):  # noqa: F811
    return Submitter(slurm, airhost)


def test_a_job_on_every_node_is_watched_to_its_end_listed_and_read_per_node_and_rank(slurm, submit):  # noqa: F811
    nodes = min(2, len(slurm.nodes))
    # hello.py rather than a collective: what is tested is the job's way, not torch's (which
    # test_slurm.py covers), and four torch ranks on this small machine are the likeliest flake.
    done = submit("submit", "--to", "slurm", "--nodes", nodes, "--watch", script("hello.py"), "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.splitlines()[0]
    world = 2 * nodes
    for rank in range(world):
        assert f"[rank {rank}] hello from rank {rank} of {world}\n" in done.stdout, done.stdout
    assert "Ctrl-C stops watching, not the job" in done.stderr
    [listed] = submit.listed()
    assert (listed["run_id"], listed["state"], listed["exit_code"]) == (run_id, "succeeded", 0)
    assert listed["scheduler_job_id"] and listed["scheduler_job_id"] in done.stderr
    assert (listed["nnodes"], listed["nprocs"]) == (nodes, 2)
    last = world - 1
    logs = submit("logs", "latest", "--node", nodes - 1, "--rank", last)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith(f"hello from rank {last} of {world}\n"), logs.stdout
    assert (submit.root / run_id / "slurm.sbatch").is_file()
    if nodes > 1:
        # The job's own join token, made by submit beside its run, this user's alone.
        token = submit.root / run_id / "join.token"
        assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) == 64
        output = (submit.root / run_id / f"slurm-{listed['scheduler_job_id']}.out").read_text()
        assert "(its join token checked)" in output, output
        assert token.read_text().strip() not in output


def test_a_running_job_is_cancelled_with_nothing_of_it_left(slurm, submit):  # noqa: F811
    nodes = min(2, len(slurm.nodes))
    done = submit("submit", "--to", "slurm", "--nodes", nodes, script("sleeper.py"), "-n", "2")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    wait_for(lambda: "rank 1 ready" in submit("logs", run_id, "--rank", "1").stdout, 90, "rank 1 to start")
    cancel = submit("cancel", run_id)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr + (submit.root / run_id / "run.json").read_text()[:400]
    record = json.loads((submit.root / run_id / "run.json").read_text())
    assert record["state"] == "cancelled", record
    for node_run_id in [run_id] + [f"{run_id}-node{k}" for k in range(1, nodes)]:
        assert not wait_until_gone(run_id=node_run_id, timeout=30), node_run_id
    again = submit("cancel", run_id)
    assert again.returncode == 2 and "has already ended: cancelled" in again.stderr


def test_sbatch_refusing_the_job_is_one_line_and_nothing_is_submitted(slurm, submit):  # noqa: F811
    done = submit("submit", "--to", "slurm", "--partition", "no_such_partition", script("hello.py"))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("airhost: sbatch refused the job: ") and "nvalid partition" in line, line
    assert not submit.root.exists() or not any(submit.root.iterdir())


def test_a_function_submitted_to_two_nodes_returns_every_rank_s_value_and_raises_the_remote_traceback(slurm, submit):  # noqa: F811
    """The Python API's jobs on Slurm: `fn.job(to="slurm", nodes=2).submit(...)` from a process of
    its own, its results read back from both nodes' run directories in global rank order."""
    import sys
    from pathlib import Path

    nodes = min(2, len(slurm.nodes))
    client = str(Path(__file__).parent / "api_scripts" / "jobs_client.py")

    def run(*args):
        done = subprocess.run([sys.executable, client, *map(str, args)], cwd=submit.cwd, env=submit.env,
                              capture_output=True, text=True, timeout=200, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    got = run("where", "slurm", nodes)
    world = 2 * nodes
    assert got["state"] == "succeeded", got
    assert got["results"] == [{"rank": r, "value": 100 + r, "node": r // 2} for r in range(world)], got
    [listed] = submit.listed()
    assert listed["run_id"] == got["run_id"] and listed["scheduler_job_id"], listed
    failed = run("fails", "slurm", nodes)
    last = world - 1
    assert failed["raised"] == "DistributedError" and last in failed["failed"], failed
    assert f"Remote traceback of rank {last}:" in failed["message"] and "ArithmeticError" in failed["message"], failed
    assert failed["cause"] == "ArithmeticError", failed


@pytest.mark.timeout(300)
def test_a_job_on_two_nodes_is_one_mlflow_run_holding_every_rank_s_metrics(slurm, submit, airhost):  # noqa: F811
    mlflow = pytest.importorskip("mlflow")
    nodes = min(2, len(slurm.nodes))
    uri = f"sqlite:///{airhost.tmp_path}/mlflow.db"
    submit.env.update({"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri})
    submit.env.pop("MLFLOW_EXPERIMENT_NAME", None)
    logger = submit.cwd / "log.py"
    logger.write_text("import os, mlflow\nrank = int(os.environ['RANK'])\n"
                      "for step in range(20):\n    mlflow.log_metric(f'loss_{rank}', 1.0 / (step + 1), step=step)\n")
    done = submit("submit", "--to", "slurm", "--nodes", nodes, "--watch", "--experiment", "two-nodes", str(logger),
                  "-n", "2", timeout=250)
    assert done.returncode == 0, done.stdout + done.stderr
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient()
    experiment = client.get_experiment_by_name("two-nodes")
    assert experiment is not None, done.stderr
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    for rank in range(2 * nodes):
        assert len(client.get_metric_history(run.info.run_id, f"loss_{rank}")) == 20, rank


@pytest.mark.timeout(400)
def test_a_job_warned_of_its_time_checkpoints_is_requeued_and_ends_as_an_uninterrupted_run(slurm, submit, airhost):  # noqa: F811
    """Slurm's warning before the time limit (`scancel -s USR1`, what `--signal=USR1@90` sends):
    both nodes' airhosts pass it to their ranks, the loop checkpoints and raises
    airhost.Preempted, node 0 requeues the job (--requeue), and the requeued job resumes from the
    checkpoint to exactly the parameters of a job that was never stopped."""
    import torch
    from pathlib import Path

    train = str(Path(__file__).parent / "restart_scripts" / "train_resume.py")
    nodes = min(2, len(slurm.nodes))
    tmp = airhost.tmp_path
    (tmp / "ckpt-ref").mkdir()
    ref = submit("submit", "--to", "slurm", "--nodes", nodes, "--watch", train, "-n", "1", "--",
                 "--ckpt", tmp / "ckpt-ref", "--out", tmp / "ref.pt", timeout=200)
    assert ref.returncode == 0, ref.stdout + ref.stderr

    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient()
    client.search_experiments()  # the store exists, as a user's does: its creation is not what is timed
    submit.env.update({"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri})
    done = submit("submit", "--to", "slurm", "--nodes", nodes, "--requeue", "--experiment", "requeued", train,
                  "-n", "1", "--",
                  "--ckpt", ckpt, "--out", tmp / "resumed.pt", "--wait-warning-at", "17")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    script = (submit.root / run_id / "slurm.sbatch").read_text()
    assert "#SBATCH --signal=USR1@90\n" in script and "#SBATCH --requeue\n" in script, script
    wait_for(lambda: (ckpt / "waiting").exists(), 120, "the ranks to wait at step 17")
    job = json.loads((submit.root / run_id / "run.json").read_text())["scheduler_job_id"]
    # What a reader of the run sees meanwhile, every 10 ms: never an end before the requeue
    # (Job.wait() would return, a prune could take the run directory it resumes from).
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                state = json.loads((submit.root / run_id / "run.json").read_text())["state"]
            except (OSError, ValueError):
                state = None
            if state and (not seen or seen[-1] != state):
                seen.append(state)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    warned = subprocess.run(["scancel", "-s", "USR1", job], env=submit.env, capture_output=True, text=True)
    assert warned.returncode == 0, warned.stderr

    def ended():
        [r] = [r for r in submit.listed() if r["run_id"] == run_id]
        slurm_state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], env=submit.env,
                                     capture_output=True, text=True).stdout.strip()
        if r["state"] == "requeued" and slurm_state == "REQUEUE_HOLD":
            # Slurm holds back the job it requeues for its credential window (cred_expire: 10 s
            # in this cluster, 120 s by default), then starts it. Nudged sooner (StartTime=now),
            # the new launch met the first run's credential revocation and failed at once
            # ("Job credential revoked"). Should Slurm have held it, it is released.
            subprocess.run(["scontrol", "release", job], env=submit.env, capture_output=True, text=True)
        # (preempted is passed through: node 0 records it, then requeues the job)
        return r["state"] in ("succeeded", "failed", "cancelled", "lost") and r

    try:
        record = wait_for(ended, 240, "the requeued job to end", interval=1.0)
    except AssertionError as e:  # say why Slurm kept it (seen once in CI: never started again)
        shown = subprocess.run(["scontrol", "show", "job", job], env=submit.env, capture_output=True, text=True)
        raise AssertionError(f"{e}\nscontrol show job {job}:\n{shown.stdout}{shown.stderr}") from None
    stop.set()
    watcher.join()
    output = "".join(p.read_text() for p in (submit.root / run_id).glob("slurm-*.out"))
    assert record["state"] == "succeeded", (record, output)
    assert "requeued" in seen and "preempted" not in seen, seen
    assert "the scheduler's warning that the job's time is nearly up" in output, output
    assert f"requeueing Slurm job {job}, which resumes it" in output, output
    assert "attempt 1: resumed from step-000017 at step 17" in output, output
    run_json = json.loads((submit.root / run_id / "run.json").read_text())
    assert run_json["restarts"] == 1 and run_json["scheduler_job_id"] == job, run_json
    expected, got = torch.load(tmp / "ref.pt"), torch.load(tmp / "resumed.pt")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after the requeue"
    # The requeued job went on in its MLflow run: one run, finished (the host ends it after its
    # run.json, so it is waited for).
    def finished():
        experiment = client.get_experiment_by_name("requeued")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        return runs and runs[0].info.status == "FINISHED" and runs
    [run] = wait_for(finished, 60, "the MLflow run to finish", interval=0.5)
    assert f"MLFLOW_RUN_ID={run.info.run_id}\n" in (submit.root / run_id / "tracking.env").read_text()


def test_a_runs_root_only_this_node_sees_is_refused_before_anything_is_submitted(slurm, submit):  # noqa: F811
    import tempfile
    from pathlib import Path

    def job_ids() -> set[str]:
        listed = subprocess.run(["squeue", "-h", "-o", "%i"], env=submit.env, capture_output=True, text=True)
        return set(listed.stdout.split())

    before = job_ids()  # an earlier test's job may still be ending (a loaded machine)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        submit.env["AIRHOST_RUNS_DIR"] = str(Path(shm) / "runs")
        done = submit("submit", "--to", "slurm", "--nodes", 2, script("hello.py"))
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert "is in memory (tmpfs) on this node" in line and "AIRHOST_RUNS_DIR" in line, line
        assert not (Path(shm) / "runs").exists() or not any((Path(shm) / "runs").iterdir())
    assert job_ids() <= before, "a job was submitted: " + " ".join(sorted(job_ids() - before))


@pytest.mark.timeout(300)
def test_the_main_example_on_two_nodes_by_two_ranks_is_one_job_with_every_rank_s_result(slurm, submit):  # noqa: F811
    """examples/mlp_ddp.py (DDP over gloo) as the README's two-node job: watched to exit 0,
    listed succeeded, every rank's return value kept in the one run directory."""
    import pickle
    from pathlib import Path

    nodes = min(2, len(slurm.nodes))
    example = str(Path(__file__).resolve().parents[2] / "examples" / "mlp_ddp.py")
    done = submit("submit", "--nodes", nodes, "--watch", example + ":main", "-n", "2", timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.splitlines()[0]
    assert "epoch 5/5" in done.stdout, done.stdout
    [listed] = submit.listed()
    assert (listed["run_id"], listed["state"], listed["nnodes"], listed["nprocs"]) == (run_id, "succeeded", nodes, 2)
    last = 2 * nodes - 1
    logs = submit("logs", "latest", "--node", nodes - 1, "--rank", last)
    assert logs.returncode == 0, logs.stderr
    node_dir = submit.root / run_id / (f"node-{nodes - 1}" if nodes > 1 else "")
    losses = [pickle.loads((d / "results" / f"rank-{r}.pkl").read_bytes())
              for r, d in ((r, submit.root / run_id if r < 2 else node_dir) for r in range(2 * nodes))]
    assert len(set(losses)) == 1 and losses[0] < 0.05, losses  # one model, converged


def test_read_backs_ask_squeue_once_for_all_runs_and_pruning_spares_a_live_job(slurm, submit, tmp_path):  # noqa: F811
    """#32: `runs show ID` asks Slurm about that run's job alone, `airhost runs` about every
    job in one squeue call, and answers are reused for two seconds across airhost commands;
    a run whose job Slurm still holds is never pruned, whatever its run.json says."""
    calls = tmp_path / "squeue.calls"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    real = shutil.which("squeue", path=submit.env["PATH"])
    counting = bindir / "squeue"  # the real squeue, each call written down
    counting.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    counting.chmod(0o755)
    submit.env["PATH"] = f"{bindir}:{submit.env['PATH']}"

    runs = {}
    for _ in range(6):  # held: pending in Slurm until released, each a job of its own
        done = submit("submit", "--to", "slurm", "--sbatch", "--hold", script("hello.py"), "-n", "1")
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.strip()
        runs[run_id] = json.loads((submit.root / run_id / "run.json").read_text())["scheduler_job_id"]
    try:
        def asked():
            text = calls.read_text() if calls.exists() else ""
            calls.unlink(missing_ok=True)
            return [line.split(" -j ", 1)[1].split()[0].strip("'").split(",") for line in text.splitlines()]

        time.sleep(2.1)  # what submit's own squeue said has aged out
        asked()
        one = list(runs)[3]
        shown = submit("runs", "show", one, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["state"] == "pending"
        assert asked() == [[runs[one]]]  # that job alone, once

        time.sleep(2.1)
        listed = submit.listed()
        assert sorted(r["state"] for r in listed) == ["pending"] * 6
        [jobs] = asked()  # one call, every job in it
        assert sorted(jobs) == sorted(runs.values())
        for _ in range(3):  # within two seconds: Slurm's answer reused, by other processes too
            assert [r["state"] for r in submit.listed()] == ["pending"] * 6
            submit("runs", "show", one, "--json")
        assert asked() == []

        # A run.json that says the run ended (as a requeued job's did until it was fixed), while
        # Slurm still holds its job: not pruned; once Slurm is done with the job, it is.
        victim = list(runs)[0]
        record = submit.root / victim / "run.json"
        record.write_text(record.read_text().replace('"state": "pending"', '"state": "preempted"'))
        pruned = submit("runs", "prune", "--keep", "0")
        assert pruned.returncode == 0, pruned.stderr
        assert victim not in pruned.stdout
        assert (submit.root / victim).is_dir()
        subprocess.run(["scancel", runs[victim]], env=submit.env, check=True)
        wait_for(lambda: subprocess.run([real, "-h", "-j", runs[victim], "-o", "%T"], env=submit.env, capture_output=True,
                                        text=True).stdout.strip() in ("", "CANCELLED"), 30, "Slurm to end the job")
        time.sleep(2.1)
        pruned = submit("runs", "prune", "--keep", "0")
        assert f"removed {victim}" in pruned.stdout, pruned.stdout + pruned.stderr
        assert not (submit.root / victim).exists()
        assert all((submit.root / r).is_dir() for r in list(runs)[1:])  # pending: never pruned
    finally:
        subprocess.run(["scancel", *runs.values()], env=submit.env, capture_output=True)

"""Lightning and HF accelerate take airhost's ranks for torchrun's: scripts written for torchrun
(tests/py/env_scripts; only lightning_api.py, the @distributed caller, names airhost) find
their rank, world size and local rank, detect the torchrun cluster environment, start no
processes of their own, and communicate over a real gloo process group. A last test runs one
script under torchrun and under airhost and compares what each launcher put in the ranks'
environment.

Lightning's import is slow on a 2-core machine (about 15 s for a 2-rank run), hence one launch
per question."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import HERE

sys.path.insert(0, str(HERE / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401

ENV_SCRIPTS = HERE / "env_scripts"
TAG = b"@@ENV@@ "


def env_script(name: str) -> str:
    path = ENV_SCRIPTS / name
    assert path.is_file(), path
    return str(path)


def records(output: bytes) -> list[dict]:
    """The `@@ENV@@ {json}` records in `output`, whatever prefixes the lines."""
    found = []
    for line in output.split(b"\n"):
        at = line.find(TAG)
        if at >= 0:
            found.append(json.loads(line[at + len(TAG):]))
    return found


def rank_record(run, n: int) -> dict:
    """The one record rank `n` printed (its own log, so no other process can have written it)."""
    found = records(run.log(n))
    assert len(found) == 1, f"rank {n} printed {len(found)} records\n{run.describe()}"
    return found[0]


def launch(airhost, *args, timeout: float = 100.0):
    """airhost(*args), once more when the only failure is torch's known exit-time abort."""
    run = airhost(*args, timeout=timeout)
    if run.rc != 0 and _helpers.torch_exit_abort(run.err):
        run = airhost(*args, timeout=timeout)
    run.assert_rc(0)
    return run


def assert_one_process_per_rank(run, recs: list[dict]) -> None:
    """Each record comes from the process airhost started for that rank, a child of the host:
    nothing (Lightning's own launcher, accelerate) started extra training processes."""
    assert len(records(run.stdout)) == len(run.ranks), run.describe()
    for n, rec in enumerate(recs):
        assert rec["pid"] == run.rank(n)["pid"], (n, rec, run.ranks)
        assert rec["ppid"] == run.pid, (n, rec["ppid"], run.pid)


# ---- Lightning ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_lightning_ddp_script_uses_the_airhost_ranks_as_torchrun_workers_and_trains(airhost):
    run = launch(airhost, env_script("lightning_ddp.py"), "--accelerators", "2")
    recs = [rank_record(run, n) for n in range(2)]
    assert_one_process_per_rank(run, recs)
    for n, rec in enumerate(recs):
        assert (rec["global_rank"], rec["local_rank"], rec["node_rank"]) == (n, n, 0), rec
        assert rec["world_size"] == 2 and rec["num_devices"] == 2, rec
        assert rec["strategy"] == "DDPStrategy", rec
        assert rec["cluster_environment"] == "TorchElasticEnvironment", rec
        assert rec["creates_processes_externally"] is True and rec["launcher_children"] == 0, rec
        assert rec["dist_initialized"] and rec["backend"] == "gloo", rec
        assert (rec["dist_rank"], rec["dist_world_size"]) == (n, 2), rec
        assert rec["gathered_ranks"] == [0, 1], rec
        assert rec["global_step"] == 4, rec
    # Seeded with their own rank, the replicas only agree if DDP synchronised them.
    assert recs[0]["checksum"] == pytest.approx(recs[1]["checksum"], rel=1e-9, abs=1e-12)


@pytest.mark.timeout(120)
def test_lightning_in_a_distributed_function_defined_in_main_trains_on_every_rank(api_tmp):
    def call():
        return _helpers.run_caller(api_tmp, [env_script("lightning_api.py")], timeout=100)

    caller = call()
    if caller.rc != 0 and _helpers.torch_exit_abort(caller.err):
        caller = call()
    out = caller.ok().result
    recs = out["results"]
    [run_dir] = _helpers.run_dirs(api_tmp)
    ranks = json.loads((run_dir / "run.json").read_text())["ranks"]
    for n, rec in enumerate(recs):
        assert rec["pid"] == ranks[n]["pid"] and rec["ppid"] == out["caller_pid"], (rec, ranks)
        assert (rec["global_rank"], rec["local_rank"], rec["world_size"]) == (n, n, 2), rec
        assert rec["cluster_environment"] == "TorchElasticEnvironment", rec
        assert rec["launcher_children"] == 0, rec
        assert rec["backend"] == "gloo" and rec["gathered_ranks"] == [0, 1], rec
        assert rec["global_step"] == 3 and rec["module_class"] == "NotebookRegressor", rec
    assert recs[0]["checksum"] == pytest.approx(recs[1]["checksum"], rel=1e-9, abs=1e-12)


# ---- HF accelerate -----------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_accelerate_sees_a_multi_cpu_run_of_the_airhost_ranks_and_gathers_across_them(airhost):
    run = launch(airhost, env_script("accelerate_cpu.py"), "--accelerators", "2", timeout=80)
    recs = [rank_record(run, n) for n in range(2)]
    assert_one_process_per_rank(run, recs)
    pids = [r["pid"] for r in recs]
    for n, rec in enumerate(recs):
        assert (rec["process_index"], rec["local_process_index"], rec["num_processes"]) == (n, n, 2), rec
        assert rec["is_main_process"] is (n == 0), rec
        assert rec["multi_cpu"] and rec["distributed_type"] == "DistributedType.MULTI_CPU", rec
        assert rec["accelerator_distributed_type"] == "DistributedType.MULTI_CPU", rec
        assert rec["accelerator_num_processes"] == 2 and rec["backend"] == "gloo", rec
        # Every rank holds what each rank alone knew, in rank order.
        assert rec["gathered"] == [100, pids[0], 101, pids[1]], rec


# ---- against torchrun itself -------------------------------------------------------------

#: What torchrun's workers get that airhost's ranks need not, and why.
TORCHRUN_ONLY = {
    # Where torch's @record writes a worker's exception for torchrun's agent to read back
    # (torch/distributed/elastic/multiprocessing/api.py). airhost captures the traceback inside
    # the rank itself; without the variable @record still logs the error and re-raises.
    "TORCHELASTIC_ERROR_FILE",
    # The agent's own signal settings (torch/distributed/launcher/api.py sets them in its
    # os.environ); workers merely inherit them and nothing in a worker reads them.
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
}
#: Variables whose value legitimately differs per launch (ports, ids) or spelling, or by design:
#: TORCHELASTIC_USE_AGENT_STORE is "True" under torchrun, whose agent serves the TCPStore for
#: clients; airhost has no agent, rank 0 serves the store (torch/distributed/rendezvous.py), so
#: airhost sets "False" (checked below) rather than pass on a caller's "True".
PER_LAUNCH = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}


@pytest.mark.timeout(120)
def test_a_rank_gets_every_variable_a_torchrun_worker_gets_and_accelerate_decides_alike(airhost, tmp_path):
    script = env_script("torchrun_parity.py")
    base = airhost.env(tmp_path / "torchrun-runs")  # the marker lets conftest find leftovers
    logs = tmp_path / "torchrun-logs"  # one file per worker: their lines would interleave on one pipe
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--log-dir", str(logs), "--redirects", "1", script],
                          cwd=airhost.work, env=base, capture_output=True, timeout=90)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    torchrun = sorted((r for f in logs.rglob("stdout.log") for r in records(f.read_bytes())),
                      key=lambda r: int(r["environ"]["RANK"]))
    assert len(torchrun) == 2, sorted(logs.rglob("*"))
    run = launch(airhost, script, "--accelerators", "2", timeout=60)
    ours = [rank_record(run, n) for n in range(2)]

    for n, (theirs, mine) in enumerate(zip(torchrun, ours)):
        given = {k: v for k, v in theirs["environ"].items() if base.get(k) != v}  # torchrun's doing
        env = mine["environ"]
        missing = sorted(set(given) - set(env) - TORCHRUN_ONLY)
        assert not missing, f"rank {n}: torchrun sets {[f'{k}={given[k]}' for k in missing]}, airhost does not"
        differ = {k: (given[k], env[k]) for k in set(given) & set(env) - PER_LAUNCH if given[k] != env[k]}
        assert not differ, f"rank {n}: (torchrun, airhost) values differ: {differ}"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False", env  # rank 0 serves the store
        assert env["MASTER_ADDR"] in ("127.0.0.1", "localhost") and 0 < int(env["MASTER_PORT"]) < 65536
        assert env["TORCHELASTIC_RUN_ID"] == env["AIRHOST_RUN_ID"] == run.run_id
        # Whatever accelerate decides from torchrun's environment (with a CPU-only torch and
        # no cpu=True: DistributedType.NO), it decides from airhost's.
        assert mine["accelerate"] == theirs["accelerate"], (n, mine["accelerate"], theirs["accelerate"])

"""The topology airhost takes from a Slurm or Kubeflow PyTorchJob environment, through the
installed CLI: --print-env, a launch, bad input. The environments here are written out by
hand, as srun and the training operator set them; tests/py/test_slurm.py runs a real Slurm."""
import re

import pytest

import _helpers  # noqa: E402  (tests/py/api_scripts, on sys.path through conftest)
from conftest import script

pytestmark = pytest.mark.timeout(60)

# What srun --nodes=2 --ntasks-per-node=1 gives the task on the second node of job 4242.
SLURM_NODE_1 = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0", "SLURM_PROCID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "1(x2)",
}

# A worker pod of a PyTorchJob with a Master and one Worker, nprocPerNode 2 (operator v1.7+).
PYTORCHJOB_WORKER = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "job-master-0", "PET_MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "1", "PET_NODE_RANK": "1",
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
}

CLUSTER_VARS = [*SLURM_NODE_1, *PYTORCHJOB_WORKER, "SLURM_GPUS_ON_NODE", "AIRHOST_DETECT"]


def rows(out: str) -> dict:
    """--print-env's table: name → (value, origin)."""
    table = {}
    for line in out.splitlines():
        m = re.match(r"^  (nnodes|node_rank|master_addr|master_port|accelerators) +(.+?)  +(\S.*)$", line)
        if m:
            table[m.group(1)] = (m.group(2).strip(), m.group(3))
    return table


def rank_env(out: str, local_rank: int) -> dict:
    """The variables --print-env lists for one local rank."""
    env, inside = {}, False
    for line in out.splitlines():
        if line.startswith("local rank "):
            inside = line.startswith(f"local rank {local_rank} ")
        elif inside and line.startswith("  "):
            k, _, v = line.strip().partition("=")
            env[k] = v
    return env


def test_print_env_under_srun_says_each_value_came_from_slurm(airhost):
    run = airhost("--print-env", "-n", "2", env=SLURM_NODE_1)
    run.assert_rc(0)
    assert run.out.splitlines()[0] == "cluster: slurm (SLURM_JOB_ID=4242)"
    t = rows(run.out)
    assert t["nnodes"] == ("2", "slurm: SLURM_STEP_NUM_NODES=2")
    assert t["node_rank"] == ("1", "slurm: SLURM_NODEID=1")
    assert t["master_addr"] == ("gpu07", "slurm: first host of SLURM_STEP_NODELIST=gpu[07-08]")
    assert t["master_port"] == ("24242", "slurm: 20000 + SLURM_JOB_ID % 10000 (SLURM_JOB_ID=4242)")
    assert t["accelerators"] == ("2 (CPU ranks)", "flag")
    env = rank_env(run.out, 1)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["GROUP_RANK"]) == ("3", "1", "4", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("gpu07", "24242")
    assert not run.run_dir, "--print-env started a run"


def test_flags_and_the_config_file_win_over_slurm(airhost, work):
    (work / "airhost.toml").write_text('master_port = 29999\n')
    run = airhost("--print-env", "--master-addr", "10.0.0.9", env=SLURM_NODE_1)
    run.assert_rc(0)
    t = rows(run.out)
    assert t["master_addr"] == ("10.0.0.9", "flag")
    assert t["master_port"] == ("29999", f"config {work}/airhost.toml")
    assert t["node_rank"] == ("1", "slurm: SLURM_NODEID=1")


def test_print_env_in_a_pytorchjob_pod(airhost):
    run = airhost("--print-env", env=PYTORCHJOB_WORKER)
    run.assert_rc(0)
    assert run.out.splitlines()[0] == "cluster: kubernetes (PET_NNODES=2 and KUBERNETES_SERVICE_HOST)"
    t = rows(run.out)
    assert t["nnodes"] == ("2", "kubernetes: PET_NNODES=2")
    assert t["node_rank"] == ("1", "kubernetes: PET_NODE_RANK=1")
    assert t["master_addr"] == ("job-master-0", "kubernetes: PET_MASTER_ADDR=job-master-0")
    assert t["master_port"] == ("23456", "kubernetes: PET_MASTER_PORT=23456")
    assert t["accelerators"] == ("2 (CPU ranks)", "kubernetes: PET_NPROC_PER_NODE=2")
    assert "note: WORLD_SIZE=4 is ignored" in run.out
    assert rank_env(run.out, 1)["RANK"] == "3"


def test_print_env_without_a_cluster(airhost):
    run = airhost("--print-env", unset_env=CLUSTER_VARS)
    run.assert_rc(0)
    assert run.out.splitlines()[0].startswith("cluster: none detected")
    assert rows(run.out)["master_addr"] == ("127.0.0.1", "default")
    assert rank_env(run.out, 0)["MASTER_PORT"] == "<a free port, chosen at launch>"


def test_a_one_node_slurm_launch_takes_its_ranks_from_slurm(airhost):
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": "localhost",
           "SLURM_STEP_TASKS_PER_NODE": "1", "PET_NPROC_PER_NODE": "3"}
    run = airhost(script("show_env.py"), "--", "RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", env=env)
    run.assert_rc(0)
    # One node: the rendezvous stays on 127.0.0.1; Slurm (not the PET_* seen after it) decides.
    assert run.log(0) == b"RANK=0\nWORLD_SIZE=1\nGROUP_WORLD_SIZE=1\nMASTER_ADDR=127.0.0.1\n"


def test_a_slurm_node_list_that_does_not_parse_is_exit_2(airhost):
    run = airhost(script("hello.py"), env={**SLURM_NODE_1, "SLURM_STEP_NODELIST": "gpu[07-"})
    run.assert_rc(2)
    assert ("airhost: cannot read the Slurm node list 'gpu[07-': the '[' at character 4 is never closed; "
            "expected host names and bracket ranges like gpu[01-04,07]") in run.err
    assert not run.run_dir


def test_several_airhosts_per_slurm_node_are_refused(airhost):
    run = airhost(script("hello.py"), env={**SLURM_NODE_1, "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_LOCALID": "5"})
    run.assert_rc(2)
    assert "this Slurm step runs 8 tasks on a node (SLURM_STEP_TASKS_PER_NODE=8(x2))" in run.err
    assert "srun --ntasks-per-node=1 airhost train.py" in run.err


def test_with_fake_nvml_more_gpus_from_slurm_than_the_node_shows_names_where_the_count_came_from(airhost):
    # The FAKE NVML (tests/fake_nvml) plays a node with one H100; Slurm says 4.
    run = airhost(script("hello.py"), env={
        **SLURM_NODE_1, "SLURM_GPUS_ON_NODE": "4", "AIRHOST_NVML_LIBRARY": _helpers.fake_nvml_library(),
        "AIRHOST_FAKE_NVML_GPUS": "NVIDIA H100 80GB HBM3:81559:GPU-aaaa"}, unset_env=["CUDA_VISIBLE_DEVICES"])
    run.assert_rc(2)
    assert "asked for 4 accelerators but this node has 1 visible GPU" in run.err
    assert "(the count came from slurm: SLURM_GPUS_ON_NODE=4; give -n to override it)" in run.err


def test_detection_can_be_turned_off(airhost):
    run = airhost("--print-env", env={**SLURM_NODE_1, "AIRHOST_DETECT": "0"})
    run.assert_rc(0)
    assert rows(run.out)["nnodes"] == ("1", "default")
    assert "note: AIRHOST_DETECT=0" in run.out

"""The environment every rank gets, the run directory, and MASTER_PORT under concurrent
launches."""
import json
import os
import re
import stat

import pytest

from conftest import free_port, script, split_lines

pytestmark = pytest.mark.timeout(60)


def rank_envs(run, work, n):
    envs = [json.loads((work / "env" / f"rank-{r}.json").read_text()) for r in range(n)]
    for r in range(n):
        assert run.log(r) == f"environment of rank {r} written\n".encode()
    return envs


def test_each_rank_gets_the_torchrun_environment(airhost, work):
    run = airhost(script("dump_env.py"), "-n", "3", unset_env=["OMP_NUM_THREADS"])
    run.assert_rc(0)
    envs = rank_envs(run, work, 3)
    run_id = run.run_json["run_id"]
    assert run.run_dir.name == run_id
    ports = set()
    for r, env in enumerate(envs):
        assert env["RANK"] == str(r)
        assert env["LOCAL_RANK"] == str(r)
        assert env["WORLD_SIZE"] == "3"
        assert env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == "0"
        assert env["ROLE_RANK"] == str(r)
        assert env["ROLE_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert re.fullmatch(r"[1-9]\d*", env["MASTER_PORT"]) and int(env["MASTER_PORT"]) < 65536
        ports.add(env["MASTER_PORT"])
        assert env["TORCHELASTIC_RUN_ID"] == run_id
        assert env["AIRHOST_RUN_ID"] == run_id
        assert env["AIRHOST_RUN_DIR"] == str(run.run_dir)
        assert env["GROUP_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "default"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["AIRHOST_HOST_PID"] == str(run.pid)
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["OMP_NUM_THREADS"] == "1"  # unset by the caller: one thread per rank
        assert "CUDA_VISIBLE_DEVICES" not in env  # no GPU here
    assert len(ports) == 1, "every rank must meet at the same MASTER_PORT"
    run.assert_logs_complete()


def test_the_callers_variables_pass_through_and_omp_num_threads_is_kept(airhost, work):
    run = airhost(script("dump_env.py"), "-n", "2",
                  env={"OMP_NUM_THREADS": "3", "MY_SETTING": "from the caller", "NCCL_DEBUG": "WARN"})
    run.assert_rc(0)
    for env in rank_envs(run, work, 2):
        assert env["OMP_NUM_THREADS"] == "3"
        assert env["MY_SETTING"] == "from the caller"
        assert env["NCCL_DEBUG"] == "WARN"
        assert env["PATH"] == os.environ["PATH"]
    run.assert_logs_complete()


def test_env_flags_and_the_config_env_table_apply_to_every_rank(airhost, work):
    (work / "airhost.toml").write_text('[env]\nFROM_FILE = "file"\nBOTH = "file"\nRANK_SEEN = "x"\n')
    run = airhost("--env", "FROM_FLAG=flag value", "--env", "BOTH=flag", "--env", "EMPTY=", script("dump_env.py"),
                  "-n", "2", "--env", "MY_SETTING=flag", env={"MY_SETTING": "caller"})
    run.assert_rc(0)
    for env in rank_envs(run, work, 2):
        assert env["FROM_FILE"] == "file"
        assert env["FROM_FLAG"] == "flag value"
        assert env["BOTH"] == "flag"  # flags over the file
        assert env["EMPTY"] == ""
        assert env["MY_SETTING"] == "flag"  # explicit --env over the caller's environment
        assert env["RANK_SEEN"] == "x"
    run.assert_logs_complete()


def test_the_run_directory_is_private_and_run_json_lists_every_rank(airhost):
    run = airhost(script("hello.py"), "-n", "4")
    run.assert_rc(0)
    assert stat.S_IMODE(run.run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run.run_dir / "logs").stat().st_mode) == 0o700
    data = run.run_json
    assert data["run_dir"] == str(run.run_dir)
    assert data["nprocs"] == 4
    assert data["entry"] == {"kind": "script", "target": script("hello.py"), "function": "", "args": []}
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert [r["local_rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    pids = [r["pid"] for r in data["ranks"]]
    assert len(set(pids)) == 4 and all(p > 0 for p in pids)
    for r in data["ranks"]:
        assert r["state"] == "succeeded" and r["exit_code"] == 0 and r["signal"] == 0 and r["error"] is None
        assert r["started_at"] <= r["ended_at"]
        for key in ("stdout_log", "stderr_log"):
            assert os.path.isfile(r[key])
            assert stat.S_IMODE(os.stat(r[key]).st_mode) == 0o600
    assert sorted(os.listdir(run.run_dir / "logs")) == sorted(
        f"rank-{n}.{s}.log" for n in range(4) for s in ("stdout", "stderr"))
    run.assert_logs_complete()


@pytest.mark.timeout(240)
def test_twenty_concurrent_launches_each_get_their_own_master_port(airhost, work):
    launches = 20
    dirs = [work / f"launch-{i}" for i in range(launches)]
    for d in dirs:
        d.mkdir()
    # all started at the same moment, then waited for
    hosts = [airhost.start(script("allreduce.py"), "-n", "2", "--timeout", "200", cwd=d) for d in dirs]
    runs = [h.finish(timeout=220) for h in hosts]
    ports = []
    for run in runs:
        everything = run.stdout + run.stderr + b"".join(run.log(n, s) for n in (0, 1) for s in ("stdout", "stderr"))
        assert b"address already in use" not in everything.lower(), run.describe()
        assert b"EADDRINUSE" not in everything, run.describe()
        run.assert_rc(0)
        lines = [split_lines(run.log(n)) for n in (0, 1)]
        found = {re.fullmatch(rb"rank \d MASTER_PORT=(\d+) sum=3", line[0]).group(1) for line in lines}
        assert len(found) == 1, found
        ports.append(found.pop())
        run.assert_logs_complete()
    assert len(set(ports)) == launches, f"MASTER_PORTs shared between concurrent runs: {sorted(ports)}"


def test_master_addr_and_master_port_flags_reach_the_ranks(airhost, work):
    port = free_port()
    run = airhost(script("dump_env.py"), "-n", "2", "--master-port", port, "--master-addr", "localhost")
    run.assert_rc(0)
    for env in rank_envs(run, work, 2):
        assert env["MASTER_PORT"] == str(port)
        assert env["MASTER_ADDR"] == "localhost"
    run.assert_logs_complete()


def test_a_master_port_held_by_a_running_launch_is_refused_before_anything_starts(airhost, work):
    port = free_port()
    first = airhost.start(script("sleeper.py"), "-n", "1", "--master-port", port, "--", "--sleep", "20")
    try:
        first.wait_printed([0], "ready")
        (work / "second").mkdir()
        second = airhost(script("hello.py"), "-n", "1", "--master-port", port, cwd=work / "second")
        assert second.rc == 2, second.describe()
        assert f"master port {port} is in use by another airhost run" in second.err
    finally:
        first.signal(15)
        first.finish(timeout=20)

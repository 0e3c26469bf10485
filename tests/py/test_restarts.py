"""--max-restarts / max_restarts: after a rank fails, the whole group is stopped and started
again with TORCHELASTIC_RESTART_COUNT raised, up to N times; a timeout or Ctrl-C is never
restarted. Resuming from a checkpoint after a restart: tests/py/test_resume.py."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, wait_for

pytestmark = pytest.mark.timeout(120)

SCRIPTS = Path(__file__).resolve().parent / "restart_scripts"
FLAKY = str(SCRIPTS / "flaky.py")


def attempts_seen(run, rank=0):
    return [int(m) for m in re.findall(rb"attempt (\d+) of max", run.log(rank))]


def test_a_failed_group_is_restarted_with_the_restart_count_until_it_succeeds(airhost):
    run = airhost(FLAKY, "-n", "3", "--max-restarts", "3", "--grace", "5", "--", "--fail-until", "2")
    run.assert_rc(0)
    # every rank ran three times, seeing restart counts 0, 1, 2 and the same run id and port
    for n in range(3):
        assert attempts_seen(run, n) == [0, 1, 2], run.log(n)
        ports = set(re.findall(rb"port (\d+)", run.log(n)))
        runs = set(re.findall(rb"run (\S+) port", run.log(n)))
        assert len(ports) == 1 and runs == {run.run_id.encode()}
    assert b"of max 3" in run.log(0)
    j = run.run_json
    assert j["outcome"] == "succeeded" and j["restarts"] == 2 and j["max_restarts"] == 3
    assert len(j["failed_attempts"]) == 2
    assert all("rank 1 exited with code 3" in m for m in j["failed_attempts"])
    # the host says so, once per restart, and the summary counts them
    for k in (1, 2):
        assert f"restarting all 3 rank(s) (restart {k} of 3)" in run.err, run.err
    assert re.search(rf"run {run.run_id}: 3 rank\(s\) succeeded after 2 restarts in ", run.err), run.err
    # the logs go on across attempts, each attempt marked
    log1 = run.log(1, "stderr").decode()
    assert log1 == ("rank 1 fails on attempt 0\n----- airhost: restart 1 of 3 -----\n"
                    "rank 1 fails on attempt 1\n----- airhost: restart 2 of 3 -----\n"), log1
    assert [r["state"] for r in j["ranks"]] == ["succeeded"] * 3
    # what the host said is in its own log, with its time
    host_log = (Path(run.run_dir) / "logs" / "host.log").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} .*restarting all 3 rank\(s\) \(restart 2 of 3\)$",
                     host_log, re.M), host_log


def test_a_restart_mark_starts_a_line_of_its_own_after_a_rank_stopped_mid_line(airhost, tmp_path):
    # A rank killed while drawing a bar leaves its line unfinished; the mark must not be glued to it.
    script = tmp_path / "bar.py"
    script.write_text("import os, sys\n"
                      "if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                      "    sys.stderr.write('epoch 1:  40%|####'); sys.stderr.flush(); os._exit(5)\n")
    run = airhost(str(script), "-n", "2", "--max-restarts", "1", "--grace", "5")
    run.assert_rc(0)
    assert run.log(1, "stderr").decode() == "epoch 1:  40%|####\n----- airhost: restart 1 of 1 -----\n"


def test_a_group_that_keeps_failing_exits_with_the_ranks_code_once_no_restart_is_left(airhost):
    run = airhost(FLAKY, "-n", "2", "--max-restarts", "2", "--grace", "5", "--", "--fail-until", "99", "--code", "7")
    run.assert_rc(7)
    assert attempts_seen(run, 0) == [0, 1, 2]
    j = run.run_json
    assert j["outcome"] == "failed" and j["restarts"] == 2 and len(j["failed_attempts"]) == 2
    assert "no restart left: the group was restarted 2 times" in j["message"]
    assert "restart 2 of 2" in run.err and "restart 3 of" not in run.err
    assert "no restart left" in run.err


def test_without_max_restarts_a_failure_ends_the_run_as_before(airhost):
    run = airhost(FLAKY, "-n", "2", "--grace", "5", "--", "--fail-until", "1")
    run.assert_rc(3)
    assert attempts_seen(run, 0) == [0]
    assert run.run_json["restarts"] == 0 and run.run_json["failed_attempts"] == []
    assert "restarting" not in run.err and "----- airhost: restart" not in run.log(1, "stderr").decode()
    assert b"of max 0" in run.log(0)


def test_the_timeout_covers_every_attempt_and_is_never_restarted(airhost):
    run = airhost(FLAKY, "-n", "2", "--max-restarts", "5", "--timeout", "4", "--grace", "2",
                  "--", "--fail-until", "1", "--then-sleep", "60")
    run.assert_rc(124)
    assert attempts_seen(run, 0) == [0, 1], "a timed-out attempt was restarted"
    assert run.run_json["outcome"] == "timed_out" and run.run_json["restarts"] == 1
    assert run.seconds < 12, f"the timeout restarted with the attempt: {run.seconds:.1f} s"


def test_ctrl_c_stops_a_restartable_run_for_good(airhost):
    host = airhost.start(FLAKY, "-n", "2", "--max-restarts", "5", "--grace", "5",
                         "--", "--fail-until", "1", "--then-sleep", "60")
    run_dir = host.run_dir()
    wait_for(lambda: b"attempt 1 of max" in (run_dir / "logs" / "rank-0.stdout.log").read_bytes(), 30,
             "the restarted attempt")
    host.signal(signal.SIGINT)
    run = host.finish(timeout=30)
    run.assert_rc(130)
    assert run.run_json["outcome"] == "interrupted" and run.run_json["restarts"] == 1
    assert attempts_seen(run, 0) == [0, 1]


@pytest.mark.parametrize("value", ["-1", "many", "1001"])
def test_a_bad_max_restarts_is_a_usage_error(airhost, value):
    run = airhost(FLAKY, "-n", "2", "--max-restarts", value)
    run.assert_rc(2)
    assert f"--max-restarts must be an integer from 0 to 1000, got '{value}'; e.g. --max-restarts 3" in run.err
    assert run.run_dir is None


def test_a_bad_max_restarts_in_the_config_file_names_file_line_and_key(airhost, work):
    (work / "airhost.toml").write_text("max_restarts = -2\n")
    run = airhost(FLAKY, "-n", "2")
    run.assert_rc(2)
    assert "airhost.toml:1:16: key 'max_restarts' must be an integer from 0 to 1000" in run.err, run.err


# ---- the Python API ------------------------------------------------------------------------------

CALLER = r'''
import json, os, sys
from airhost import distributed

FAIL_UNTIL = int(sys.argv[2])  # a global of __main__: travels with the function

@distributed(num_accelerators=2, max_restarts=int(sys.argv[1]), tracking=False, grace=5)
def step():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt < FAIL_UNTIL and os.environ["RANK"] == "1":
        raise RuntimeError(f"flaky on attempt {attempt}")
    if attempt < FAIL_UNTIL:
        import time; time.sleep(30)
    return {"rank": int(os.environ["RANK"]), "attempt": attempt}

try:
    out = {"results": step.distributed()}
except Exception as e:
    out = {"error": type(e).__name__, "message": str(e)}
print("RESULT " + json.dumps(out))
'''


def run_caller(tmp_path, *args):
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(tmp_path / "runs"), AIRHOST_TEST_MARK=str(tmp_path) + os.sep)
    p = subprocess.run([sys.executable, "-c", CALLER, *map(str, args)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), p


def test_the_python_api_restarts_the_function_and_returns_the_last_attempts_results(tmp_path):
    out, p = run_caller(tmp_path, 2, 2)
    assert out == {"results": [{"rank": 0, "attempt": 2}, {"rank": 1, "attempt": 2}]}, p.stderr
    for k in (1, 2):
        assert re.search(rf"^airhost: run \S+ failed: rank 1 exited with code 1 \(RuntimeError: flaky on attempt {k - 1}\); "
                         rf"restarting every rank \(restart {k} of 2\)$", p.stderr, re.M), p.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["restarts"] == 2


def test_the_python_api_raises_the_last_failure_once_no_restart_is_left(tmp_path):
    out, p = run_caller(tmp_path, 1, 5)
    assert out["error"] == "DistributedError", out
    assert "flaky on attempt 1" in out["message"] and "no restart left" not in out["message"]
    assert "restart 1 of 1" in p.stderr and "restart 2 of" not in p.stderr


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_the_python_api_refuses_a_bad_max_restarts_before_anything_starts(value):
    from airhost import distributed
    with pytest.raises(ValueError, match=r"max_restarts must be an integer from 0 to 1000, got "):
        distributed(max_restarts=value)

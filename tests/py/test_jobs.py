"""The Python API's jobs, on the local target: a @distributed function submitted with
`fn.job(to="local").submit(...)` runs detached, hands back one value per rank in rank order,
raises the failing rank's remote traceback, is attached to by run id from a new process,
reads its logs and is cancelled with nothing of it left. Real processes, real signals; the
same on Slurm across two nodes is in test_submit_slurm.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_until_gone

pytestmark = pytest.mark.timeout(180)

CLIENT = str(Path(__file__).parent / "api_scripts" / "jobs_client.py")


class Client:
    def __init__(self, airhost, extra_env=None):
        self.root = airhost.tmp_path / "runs"
        self.env = airhost.env(self.root, extra_env)
        self.cwd = airhost.work

    def __call__(self, *args) -> dict:
        done = subprocess.run([sys.executable, CLIENT, *map(str, args)], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=170, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def client(airhost):
    return Client(airhost)


def test_a_submitted_function_returns_every_rank_s_value_and_a_new_process_attaches_to_it(client):
    got = client("where", "local", 1)
    assert got["state"] == "succeeded"
    assert got["results"] == [{"rank": r, "value": 100 + r, "node": 0} for r in range(2)]
    # A restarted kernel: a new process knows only the run id, by a prefix of it too.
    again = client("attach", "-", 0, got["run_id"][:-2])
    assert again == {"run_id": got["run_id"], "results": got["results"]}
    record = json.loads((client.root / got["run_id"] / "run.json").read_text())
    assert record["entry"]["kind"] == "pickled" and (client.root / got["run_id"] / "where.pkl").is_file()


def test_a_job_outlives_the_process_that_submitted_it(client):
    first = client("submit-only", "local", 1)  # the submitting process exits at once
    got = client("attach", "-", 0, first["run_id"])
    assert got["results"] == [{"rank": r, "value": 7 + r, "node": 0} for r in range(2)]


def test_a_failing_rank_raises_with_its_remote_traceback_and_exception(client):
    got = client("fails", "local", 1)
    assert got["raised"] == "DistributedError" and got["failed"] == [1], got
    assert "ArithmeticError: rank 1 cannot go on" in got["message"], got["message"]
    assert "Remote traceback of rank 1:" in got["message"] and "in fails_on_last" in got["message"]
    assert got["cause"] == "ArithmeticError" and got["state"] == "failed"


def test_cancel_stops_every_rank_and_the_run_ends_cancelled(client):
    got = client("cancel", "local", 1)
    assert got["state"] == "cancelled", got
    assert not wait_until_gone(run_id=got["run_id"], timeout=10)
    record = json.loads((client.root / got["run_id"] / "run.json").read_text())
    assert record["state"] == "cancelled" and record["exit_code"] == 143


def test_bad_job_settings_are_one_clear_error_before_anything_is_submitted(airhost, client):
    got = client("bad-slurm-key", "local", 1)
    assert got["raised"] == "TypeError" and "partitoin" in got["message"] and "partition" in got["message"]
    no_slurm = Client(airhost, {"PATH": os.path.dirname(sys.executable)})  # no sbatch on this PATH
    refused = no_slurm("refused", "slurm", 1)
    assert refused["raised"] == "ValueError" and "needs sbatch on PATH" in refused["message"], refused
    assert not client.root.exists() or not any(client.root.iterdir())

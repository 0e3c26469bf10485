"""Runs past their launch: run.json through a run's life (running while it runs, replaced as it
ends, `lost` when its host died without ending it), and the commands that read the runs root
back: `airhost runs [--json] | runs show ID`, `airhost logs ID`, `airhost cancel ID`.

Every test keeps its runs in one runs root of its own (AIRHOST_RUNS_DIR), so that several
launches and the commands about them see the same runs; real hosts, real signals."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import script, wait_for, wait_until_gone

pytestmark = pytest.mark.timeout(120)


class Runs:
    """One runs root: launches into it (foreground or background) and the commands on it."""

    def __init__(self, airhost, tmp_path: Path):
        self.airhost = airhost
        self.root = tmp_path / "runs"
        self.env = airhost.env(self.root)
        self.cwd = airhost.work

    def __call__(self, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run([self.airhost.binary, *map(str, args)], cwd=self.cwd, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def start(self, *args, env=None) -> subprocess.Popen:
        return subprocess.Popen([self.airhost.binary, *map(str, args)], cwd=self.cwd, env={**self.env, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def record(self, run_id: str) -> dict:
        return json.loads((self.root / run_id / "run.json").read_text())

    def only_dir(self) -> Path:
        return wait_for(lambda: next(iter(p for p in self.root.iterdir() if p.is_dir()), None), 10, "a run directory")

    def listed(self) -> list[dict]:
        done = self("runs", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def running_record(self) -> dict:
        """run.json of the one run in the root, once it says running."""
        run_dir = self.only_dir()
        return wait_for(lambda: (r := json.loads((run_dir / "run.json").read_text()))["state"] == "running" and r,
                        15, "run.json saying running")


@pytest.fixture
def runs(airhost, tmp_path) -> Runs:
    return Runs(airhost, tmp_path)


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("airhost: "), text
    return lines[0]


# ---- run.json through the run's life ---------------------------------------------------------


def test_run_json_says_running_with_its_host_while_the_run_is_on_then_how_it_ended(runs):
    host = runs.start(script("sleeper.py"), "-n", "2", "--", "--sleep", "1.5", env={"SLURM_JOB_ID": "4242"})
    live = runs.running_record()
    assert live["host_pid"] == host.pid
    assert live["outcome"] is None and live["exit_code"] is None and live["ended_at"] is None
    assert live["started_at"] > time.time() - 30
    assert live["scheduler_job_id"] == "4242"
    assert live["host_handles_signals"] is True
    assert (live["nnodes"], live["node_rank"], live["nprocs"]) == (1, 0, 2)
    assert [r["rank"] for r in live["ranks"]] == [0, 1]
    assert live["ranks"][1]["stdout_log"].endswith("/logs/rank-1.stdout.log")
    assert host.wait(timeout=60) == 0
    end = runs.record(live["run_id"])
    assert (end["state"], end["outcome"], end["exit_code"]) == ("succeeded", "succeeded", 0)
    assert end["started_at"] == pytest.approx(live["started_at"])
    assert end["ended_at"] >= end["started_at"] + 1.5
    assert end["host_pid"] == host.pid and end["scheduler_job_id"] == "4242"
    assert all(r["state"] == "succeeded" for r in end["ranks"])


def test_a_run_whose_host_was_killed_outright_is_lost_not_running_forever(runs):
    host = runs.start(script("sleeper.py"), "-n", "2")
    live = runs.running_record()
    host.send_signal(signal.SIGKILL)
    host.wait(timeout=10)
    assert not wait_until_gone(run_id=live["run_id"], timeout=10)
    [listed] = runs.listed()
    assert listed["state"] == "lost"
    assert runs.record(live["run_id"])["state"] == "running"  # the file is as the host left it
    done = runs("cancel", live["run_id"])
    assert done.returncode == 2
    assert "is not running" in one_line(done.stderr) and "nothing to cancel" in done.stderr


# ---- airhost runs, runs show --------------------------------------------------------------


def test_runs_lists_launches_newest_first_with_their_states(runs):
    ok = runs(script("hello.py"), "-n", "2")
    assert ok.returncode == 0, ok.stderr
    time.sleep(1.1)  # run ids carry the second they began
    failed = runs(script("fail.py"), "-n", "2", "--", "--how", "exit", "--code", "3")
    assert failed.returncode == 3, failed.stderr
    listed = runs.listed()
    assert [r["state"] for r in listed] == ["failed", "succeeded"]
    assert [r["exit_code"] for r in listed] == [3, 0]
    assert listed[0]["started_at"] > listed[1]["started_at"]
    assert all((r["nnodes"], r["nprocs"]) == (1, 2) for r in listed)
    assert listed[0]["entry"].endswith("fail.py") and listed[0]["args"] == ["--how", "exit", "--code", "3"]
    assert listed[1]["entry"].endswith("hello.py") and listed[1]["scheduler_job_id"] is None

    table = runs("runs", env={"COLUMNS": "1000"})  # whatever width the test runner's COLUMNS says
    assert table.returncode == 0
    header, first, second = table.stdout.splitlines()
    assert header.split()[:6] == ["ID", "STATE", "NODES×RANKS", "STARTED", "DURATION", "EXIT"]
    assert first.startswith(listed[0]["run_id"]) and " failed " in first and " 1×2 " in first
    assert second.startswith(listed[1]["run_id"]) and " succeeded " in second


def test_runs_show_names_the_root_cause_with_its_traceback(runs):
    failed = runs(script("fail.py"), "-n", "2", "--", "--rank", "1", "--how", "raise")
    assert failed.returncode == 1, failed.stderr
    shown = runs("runs", "show", "latest")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "failed (exit 1)" in out.splitlines()[0]
    assert "rank 1 (node 0, local 1" in out and "failed, exit 1: ValueError" in out
    assert "rank 0 (node 0, local 0" in out and "stopped" in out
    root = out[out.index("root cause: rank 1"):]
    assert "Traceback (most recent call last):" in root
    assert "RAISE-HERE" in root and "ValueError: boom on rank 1" in root
    assert "/logs/rank-1.stderr.log" in out


def test_bad_run_ids_are_one_line_and_exit_2(runs):
    empty = runs("logs", "latest")
    assert empty.returncode == 2 and "no runs in" in one_line(empty.stderr)
    for _ in range(2):
        assert runs(script("hello.py"), "-n", "1").returncode == 0
        time.sleep(1.1)
    ids = [r["run_id"] for r in runs.listed()]
    unknown = runs("runs", "show", "no-such-run")
    assert unknown.returncode == 2 and "no run 'no-such-run'" in one_line(unknown.stderr)
    common = os.path.commonprefix(ids)
    ambiguous = runs("logs", common)
    assert ambiguous.returncode == 2 and "ambiguous" in one_line(ambiguous.stderr)
    # A unique prefix is enough.
    shown = runs("runs", "show", ids[1][: len(common) + 1])
    assert shown.returncode == 0 and ids[1] in shown.stdout.splitlines()[0]


# ---- airhost logs ----------------------------------------------------------------------------


def test_logs_prints_one_rank_or_every_rank_and_its_tail(runs):
    done = runs(script("hello.py"), "-n", "2")
    assert done.returncode == 0, done.stderr
    run_dir = runs.only_dir()
    one = runs("logs", "latest", "--rank", "1")
    assert one.returncode == 0
    assert one.stdout.encode() == (run_dir / "logs" / "rank-1.stdout.log").read_bytes()
    every = runs("logs", "latest")
    for n in (0, 1):
        for line in (run_dir / "logs" / f"rank-{n}.stdout.log").read_text().splitlines():
            assert f"[rank {n}] {line}" in every.stdout.splitlines()
    tail = runs("logs", "latest", "--rank", "0", "--tail", "1")
    assert tail.stdout.splitlines() == (run_dir / "logs" / "rank-0.stdout.log").read_text().splitlines()[-1:]
    bad = runs("logs", "latest", "--rank", "7")
    assert bad.returncode == 2 and "not rank 7" in one_line(bad.stderr)
    node = runs("logs", "latest", "--node", "1")
    assert node.returncode == 2 and "node 0 only" in one_line(node.stderr)


def test_logs_follow_prints_as_the_run_goes_and_ends_with_it(runs):
    host = runs.start(script("sleeper.py"), "-n", "2", "--", "--sleep", "2")
    runs.running_record()
    follow = subprocess.Popen([runs.airhost.binary, "logs", "latest", "--rank", "1", "--follow"], cwd=runs.cwd,
                              env=runs.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = follow.communicate(timeout=60)
    assert host.wait(timeout=60) == 0
    assert follow.returncode == 0, err
    assert out.splitlines() == ["rank 1 ready", "rank 1 woke up"]


# ---- airhost cancel --------------------------------------------------------------------------


def test_cancel_ends_a_live_run_cancelled_with_nothing_of_it_left(runs):
    host = runs.start(script("sleeper.py"), "-n", "2", "--", "--grandchild")
    live = runs.running_record()
    wait_for(lambda: all((runs.cwd / "printed" / f"rank-{n}.stdout").exists() for n in (0, 1)), 30, "both ranks up")
    t0 = time.monotonic()
    done = runs("cancel", live["run_id"][:17])  # a prefix
    assert done.returncode == 0, done.stderr
    assert "cancelled (exit 143)" in done.stderr
    assert time.monotonic() - t0 < 15
    assert host.wait(timeout=10) == 143
    assert not wait_until_gone(run_id=live["run_id"], timeout=5)
    end = runs.record(live["run_id"])
    assert (end["state"], end["outcome"], end["exit_code"]) == ("cancelled", "interrupted", 143)
    assert end["message"] == f"run {live['run_id']} was cancelled (airhost cancel); every rank was stopped", end
    [listed] = runs.listed()
    assert listed["state"] == "cancelled" and "SIGTERM" not in listed["message"]

    again = runs("cancel", "latest")
    assert again.returncode == 2
    assert "has already ended: cancelled (exit 143)" in one_line(again.stderr)


def test_a_signal_that_is_not_a_cancel_leaves_the_run_interrupted(runs):
    host = runs.start(script("sleeper.py"), "-n", "1")
    live = runs.running_record()
    host.send_signal(signal.SIGTERM)
    assert host.wait(timeout=30) == 143
    assert runs.record(live["run_id"])["state"] == "interrupted"


def test_a_python_api_run_is_listed_and_its_logs_read_like_any_other(runs, tmp_path):
    caller = tmp_path / "api_caller.py"
    caller.write_text(
        "from airhost import distributed\n\n"
        "@distributed(num_accelerators=2)\n"
        "def f():\n"
        "    import os\n"
        "    print('api rank', os.environ['RANK'], flush=True)\n"
        "    return int(os.environ['RANK'])\n\n"
        "if __name__ == '__main__':\n"
        "    print(f.distributed())\n")
    import sys
    done = subprocess.run([sys.executable, str(caller)], cwd=runs.cwd, env=runs.env, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr
    [listed] = runs.listed()
    assert (listed["state"], listed["exit_code"], listed["nprocs"]) == ("succeeded", 0, 2)
    assert listed["entry"] == "f() (Python API)"  # named by its function (#33 item 9)
    logs = runs("logs", "latest", "--rank", "1")
    assert logs.stdout == "api rank 1\n"
    # Its host is the caller's process, which keeps its signals: cancel says where to cancel it.
    assert runs.record(listed["run_id"])["host_handles_signals"] is False


def test_the_runs_root_lists_runs_only_and_names_a_corrupt_record(runs):
    # #33 item 6: a folder that is not a run was listed, became `latest`, and was never pruned;
    # a run whose run.json does not parse said "try again in a moment".
    ok = runs(script("hello.py"), "-n", "1")
    assert ok.returncode == 0, ok.stderr
    run_id = runs.listed()[0]["run_id"]
    backup = runs.root / "backup"
    (backup / "old").mkdir(parents=True)  # the user's own folder, newer than the run
    listed = runs.listed()
    assert [r["run_id"] for r in listed] == [run_id]
    latest = runs("logs", "latest")
    assert latest.returncode == 0 and "hello from rank 0" in latest.stdout, latest.stderr

    (runs.root / run_id / "run.json").write_text('{"run_id": "' + run_id + '", "state": "succ')  # cut short
    logs = runs("logs", run_id)
    assert logs.returncode == 2, logs.stderr
    assert f"cannot read run {run_id}: its record {runs.root / run_id}/run.json is corrupt" in logs.stderr, logs.stderr
    assert "try again" not in logs.stderr
    assert backup.is_dir()


def test_a_live_run_s_record_shows_each_rank_as_it_is(runs):
    # #33 item 4: `runs show` said every rank of a running run was pending, pid 0, to its end.
    host = runs.start(script("sleeper.py"), "-n", "2", "--", "--sleep", "4")
    run_dir = runs.only_dir()

    def both_running():
        r = json.loads((run_dir / "run.json").read_text())
        return r["state"] == "running" and all(k["state"] == "running" and k["pid"] > 0 for k in r["ranks"]) and r

    live = wait_for(both_running, 30, "run.json showing both ranks running")
    for k in live["ranks"]:
        cmdline = Path(f"/proc/{k['pid']}/cmdline").read_bytes()
        assert b"sleeper.py" in cmdline, cmdline  # the rank's own process
        assert k["started_at"] > 0 and k["ended_at"] == 0
    shown = runs("runs", "show", live["run_id"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert [(k["pid"], k["state"]) for k in json.loads(shown.stdout)["ranks"]] == \
        [(k["pid"], "running") for k in live["ranks"]]
    text = runs("runs", "show", live["run_id"]).stdout
    assert f"pid {live['ranks'][1]['pid']}" in text, text
    assert host.wait(timeout=60) == 0
    end = runs.record(live["run_id"])
    assert [k["pid"] for k in end["ranks"]] == [k["pid"] for k in live["ranks"]]
    assert all(k["state"] == "succeeded" for k in end["ranks"])



def test_runs_reads_at_a_glance_sizes_kept_runs_and_a_terminal_s_width(runs):
    # #33 item 9: a size column and a kept marker; no line wider than the terminal.
    for _ in range(2):
        done = runs(script("hello.py"), "-n", "1", "--", "--a-long-argument-that-makes-the-entry-wide", "x" * 60)
        assert done.returncode == 0, done.stderr
        time.sleep(1.1)
    listed = runs.listed()
    kept_id = listed[1]["run_id"]
    assert runs("runs", "keep", kept_id).returncode == 0
    listed = runs.listed()
    assert [r["kept"] for r in listed] == [False, True]
    assert all(r["bytes"] > 0 for r in listed)
    table = runs("runs", env={"COLUMNS": "130"}).stdout
    lines = table.splitlines()
    assert lines[0].split()[:8] == ["ID", "STATE", "NODES×RANKS", "STARTED", "DURATION", "EXIT", "SIZE", "JOB"]
    assert all(len(line) <= 130 for line in lines), table
    narrow = runs("runs", env={"COLUMNS": "60"}).stdout  # narrower than the other columns: lines cut
    assert all(len(line) <= 60 for line in narrow.splitlines()), narrow
    assert any(line.startswith(kept_id + "*") for line in lines), table
    assert lines[-1].startswith("* kept: never pruned"), table
    assert any(line.endswith("...") for line in lines), table  # the entry cut, not the line wrapped
    wide = runs("runs", env={"COLUMNS": ""}).stdout  # not a terminal, no COLUMNS: every character
    assert "x" * 60 in wide
    shown = runs("runs", "show", kept_id).stdout
    assert "size:" in shown and "(kept: never pruned)" in shown, shown


def test_flags_and_empty_logs_say_what_they_expect(runs):
    bad = runs("runs", "prune", "--keep", "-1")
    assert bad.returncode == 2 and one_line(bad.stderr) == \
        "airhost: --keep takes a count of runs (0 or more), got '-1'; e.g. --keep 100"
    zero = runs("runs", "prune", "--older-than", "0")
    assert zero.returncode == 2 and "--older-than must be more than 0" in zero.stderr
    unit = runs("runs", "prune", "--older-than", "3x")
    assert unit.returncode == 2 and "1h30m, 7d or 500ms" in unit.stderr  # the d unit it takes is listed
    (runs.cwd / "silent.py").write_text("pass\n")
    quiet = runs(str(runs.cwd / "silent.py"), "-n", "1")
    assert quiet.returncode == 0, quiet.stderr
    logs = runs("logs", "latest")
    assert logs.returncode == 0 and logs.stdout == ""
    assert one_line(logs.stderr).startswith("airhost: run ") and " wrote no output (logs: " in logs.stderr, logs.stderr

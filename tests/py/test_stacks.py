"""`airhost stacks`, Ctrl-\\ and the timeout's report: every rank's Python stacks of a live run,
grouped, the odd one out first. Real gloo ranks: rank 0 waits in all_reduce while rank 1 is
elsewhere (tests/py/scripts/hang.py), in a Python loop or in a C call that holds the GIL."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import live_processes, marker_of, script, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401

pytestmark = pytest.mark.timeout(120)


class Hang:
    """A background `airhost hang.py MODE` of 2 ranks (`straggler.py` for "straggle"), and
    `airhost stacks` on its runs root."""

    def __init__(self, airhost, tmp_path: Path, mode: str, *flags):
        self.airhost = airhost
        self.dir = tmp_path / "hang"
        self.dir.mkdir()
        target, args = (script("straggler.py"), [self.dir]) if mode == "straggle" else (script("hang.py"), [mode, self.dir])
        self.started = airhost.start(target, "-n", "2", *flags, "--", *args)
        self.env = airhost.env(self.started.runs_root)
        wait_for(lambda: all((self.dir / f"ready-{r}").exists() for r in (0, 1)), 60, "both ranks in the group")

    def stacks(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([self.airhost.binary, "stacks", *map(str, args)], env=self.env, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    def stacks_json(self, *args) -> dict:
        done = self.stacks(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def settled(self) -> dict:
        """The stacks once rank 0 is in all_reduce (it enters it a moment after ready-0)."""
        def ready():
            data = self.stacks_json()
            return data if "in all_reduce" in data["ranks"][0]["where"] else None
        return wait_for(ready, 30, "rank 0 waiting in all_reduce")

    def release(self):
        (self.dir / "release").touch()
        return self.started.finish(timeout=60)


def test_stacks_name_the_rank_in_its_data_loading_first_and_the_others_all_reduce(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "loop")
    data = hang.settled()
    first, second = data["groups"]
    assert first["ranks"] == [1] and first["where"].endswith("in load_batch"), data["groups"]
    assert "hang.py:" in first["where"]
    assert second["ranks"] == [0] and second["where"].endswith("in all_reduce"), data["groups"]
    rank1 = data["ranks"][1]
    assert rank1["answered"] and rank1["node"] == 0 and rank1["pid"] > 0
    main = rank1["threads"][0]
    assert main["main"] and [f["function"] for f in main["frames"]][:1] == ["load_batch"]
    assert Path(data["file"]).is_file() and Path(data["file"]).parent.name == "stacks"

    done = hang.stacks()  # the text: the odd one out first, with its rank, node, pid and frame
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("stacks of run ") and "2 ranks in 2 groups" in lines[0], done.stdout
    heads = [line for line in lines if line.startswith("rank")]
    assert heads[0].startswith(f"rank 1 (node 0, pid {rank1['pid']}) is in ") and heads[0].endswith("in load_batch"), heads
    assert heads[1].startswith("rank 0 (node 0, pid ") and heads[1].endswith("in all_reduce"), heads

    run = hang.release()
    run.assert_rc(0)
    assert [r["state"] for r in run.ranks] == ["succeeded", "succeeded"]


def test_a_rank_in_a_c_call_that_holds_the_gil_answers_too(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "c")
    data = hang.settled()
    assert data["groups"][0]["ranks"] == [1], data["groups"]
    rank1 = data["ranks"][1]
    assert rank1["answered"], rank1
    assert rank1["where"].endswith("in stuck_in_c") and "hang.py:" in rank1["where"], rank1
    hang.release().assert_rc(0)


def test_a_rank_that_cannot_answer_is_named_with_its_proc_state(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "loop")
    pid = hang.settled()["ranks"][1]["pid"]
    assert pid > 0  # never 0: os.kill(0, ...) would stop this very process group
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        data = hang.stacks_json()
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert took < 10, took
    rank1 = data["ranks"][1]
    assert not rank1["answered"] and rank1["status"].startswith("no answer within"), rank1
    assert rank1["proc_state"].startswith("T"), rank1
    assert data["ranks"][0]["answered"]
    assert data["groups"][0]["ranks"] == [1] and "state T" in data["groups"][0]["where"], data["groups"]
    hang.release().assert_rc(0)


def test_ctrl_backslash_prints_the_stacks_writes_them_down_and_the_run_goes_on(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "loop")
    hang.settled()
    run_dir = hang.started.run_dir()
    before = set((run_dir / "stacks").glob("*.txt"))
    hang.started.signal(signal.SIGQUIT)
    new = wait_for(lambda: set((run_dir / "stacks").glob("*.txt")) - before, 15, "a new stacks/<time>.txt")
    text = next(iter(new)).read_text()
    assert "rank 1 (node 0, pid " in text and "in load_batch" in text, text
    assert "==== rank 0" in text and "in all_reduce" in text, text
    run = hang.release()
    run.assert_rc(0)
    err = run.err
    assert "airhost: stacks of run " in err, run.describe()
    assert err.index("airhost: rank 1 (node 0") < err.index("airhost: rank 0 (node 0"), run.describe()
    assert "in load_batch" in err
    assert run.run_json["state"] == "succeeded"


def test_a_run_ended_by_its_timeout_says_where_each_rank_was(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "loop", "--timeout", "6")
    run = hang.started.finish(timeout=60)
    run.assert_rc(124)
    err = run.err
    assert "the timeout passed: where each rank is" in err, run.describe()
    assert "airhost: rank 1 (node 0" in err and "in load_batch" in err, run.describe()
    assert list((run.run_dir / "stacks").glob("*.txt")), "no stacks file"


SURVIVOR = """
import os, time

def long_step():
    time.sleep(60)

if os.environ["RANK"] == "1":
    time.sleep(1)
    raise RuntimeError("rank 1 fails on purpose")
long_step()
"""


def test_a_failure_says_where_the_other_ranks_were_before_they_are_stopped(airhost, tmp_path):
    program = tmp_path / "survivor.py"
    program.write_text(SURVIVOR)
    t0 = time.monotonic()
    run = airhost(program, "-n", "3", timeout=60)
    run.assert_rc(1)
    assert time.monotonic() - t0 < 30, "the survivors were not stopped promptly"
    err = run.err
    assert "airhost: rank 1 failed: where the other ranks are, before they are stopped" in err, run.describe()
    assert re.search(r"airhost: ranks 0,2 \(node 0, pids \d+,\d+\) are in \S*survivor\.py:\d+ in long_step", err), \
        run.describe()
    assert "airhost: rank 1 (node 0, pid" in err and "has exited" in err, run.describe()
    assert list((run.run_dir / "stacks").glob("*.txt")), "no stacks file"
    # Reported before the survivors were stopped: they then ended by SIGTERM, as before.
    assert err.index("where the other ranks are") < err.index("failed: rank 1 exited with code 1")
    assert {r["rank"]: r["state"] for r in run.ranks} == {0: "stopped", 1: "failed", 2: "stopped"}, run.ranks


def test_stacks_of_the_python_api_future_and_of_a_job(api_tmp):
    caller = _helpers.run_scenario(api_tmp, "stacks_api.py", "future", api_tmp)
    out = caller.ok().result
    assert out["groups"][0]["ranks"] == [1] and out["groups"][0]["where"].endswith("in load_batch"), out
    assert out["rank0"].endswith("in all_reduce"), out
    assert out["results"] == [2.0, 2.0]
    assert [g["ranks"] for g in out["job_groups"]] == [[1], [0]], out["job_groups"]
    assert out["job_groups"][0]["where"].endswith("in load_batch")
    for source in ("future", "job"):  # a sampling from Python: the straggler first
        groups = out["sampled"][source]
        assert [g["function"] for g in groups] == ["load_batch", "all_reduce"], (source, groups)
    assert out["after"]["future"].startswith("ValueError: the run has ended"), out
    assert out["after"]["job"].startswith("ValueError: run ") and "has ended: succeeded (exit 0)" in out["after"]["job"], out


def test_asking_a_run_whose_directory_is_not_made_yet_is_no_host_there_at_any_path_length(tmp_path):
    # .submit() knows its run directory before the host makes it; a path longer than sun_path
    # goes through the directory's descriptor, which must say "no host" too (CI: FileNotFoundError)
    from airhost import _stacks

    for run_dir in (tmp_path / "r", tmp_path / ("x" * 120) / "r"):
        with pytest.raises(ConnectionError, match="no airhost host answers"):
            _stacks.ask(str(run_dir), timeout=1)


def test_bad_input_is_one_line_and_exit_2(airhost, tmp_path):
    root = tmp_path / "runs"
    env = airhost.env(root)

    def stacks(*args):
        done = subprocess.run([airhost.binary, "stacks", *args], env=env, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        return done.stderr

    assert "no live run of yours" in stacks()
    assert "unknown flag '--bogus'" in stacks("--bogus")
    # A run that ended, with its last stacks: the timeout's report left them.
    ended = airhost(script("sleeper.py"), "--timeout", "2", "--", "--sleep", "30")
    ended.assert_rc(124)
    env["AIRHOST_RUNS_DIR"] = str(ended.runs_root)
    assert "no live run of yours" in stacks()
    line = stacks("latest")
    assert f"run {ended.run_id} has ended: timed_out (exit 124); its last stacks: {ended.run_dir}/stacks/" in line, line
    assert "no run 'nope'" in stacks("nope")
    # Two runs whose ids share a prefix: ambiguous.
    for suffix in ("aaaaaa", "bbbbbb"):
        d = ended.runs_root / f"20990101-000000-{suffix}"
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"run_id": d.name, "state": "succeeded", "exit_code": 0}))
    assert "20990101-000000" in stacks("20990101-000000") and "ambiguous" in stacks("20990101-000000").lower()
    # Another user's live run.
    other = ended.runs_root / "20990102-000000-cccccc"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"run_id": other.name, "state": "running", "host_pid": os.getpid(),
                                                "hostname": os.uname().nodename}))
    if os.geteuid() == 0:
        os.chown(other, 4242, 4242)
        assert "belongs to" in stacks("20990102") and "your own runs only" in stacks("20990102")


def test_warm_started_ranks_answer_too(airhost, tmp_path):
    from test_warm import Warm

    warm = Warm(airhost, tmp_path)
    warm.start("--preload", "torch")
    try:
        hang = Hang(airhost, tmp_path, "loop")
        data = hang.settled()
        assert [g["ranks"] for g in data["groups"]] == [[1], [0]], data["groups"]
        assert data["groups"][0]["where"].endswith("in load_batch"), data["groups"]
        run = hang.release()
        run.assert_rc(0)
        assert "warm start (server pid" in run.err, run.err
    finally:
        warm.stop()


# ---- sampling: where each rank spends its time -------------------------------------------


def test_sampling_names_the_straggler_and_what_the_others_wait_in(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "straggle")
    data = hang.stacks_json("--sample", "3s")
    assert data["rounds"] >= 10 and data["interval_ms"] == 100 and data["seconds"] >= 3, data
    first, second = data["groups"]
    assert first["ranks"] == [1] and first["function"] == "load_batch", data["groups"]
    assert second["ranks"] == [0] and second["function"] == "all_reduce", data["groups"]
    zero, one = data["ranks"]
    top1, top0 = one["functions"][0], zero["functions"][0]
    assert top1["function"] == "load_batch" and top1["file"].endswith("straggler.py") and top1["own_share"] >= 0.5, one
    assert top1["caller"].endswith("in <module>"), top1
    assert top0["function"] == "all_reduce" and top0["own_share"] >= 0.5, zero
    assert one["answered"] == one["asked"] >= 10, one
    # The host's view of each rank's CPU over the sampling: the straggler computes.
    assert one["cpu_percent"] is not None and one["cpu_percent"] > 30, one
    assert zero["cpu_percent"] is not None, zero
    assert Path(data["file"]).is_file() and Path(data["file"]).name.startswith("sample-"), data["file"]

    done = hang.stacks("--sample", "1s")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("sampled run ") and "2 ranks in 2 groups" in lines[0], done.stdout
    assert re.match(r"rank 1: \d+(-\d+)?% in load_batch \(straggler\.py:\d+\); rank 0: \d+(-\d+)?% in all_reduce \(", lines[1]), done.stdout
    heads = [line for line in lines if line.startswith("rank ") and "samples" in line]
    assert heads[0].startswith(f"rank 1 (node 0, pid {one['pid']}, ") and "% CPU): " in heads[0], heads
    # A plain `airhost stacks` of the run still takes stacks, not the sample.
    assert hang.stacks_json()["groups"][0]["where"].endswith(("in load_batch", "in all_reduce", "in <module>"))

    run = hang.release()
    run.assert_rc(0)


def test_one_sampling_at_a_time_and_a_sampler_that_goes_away_ends_it(airhost, tmp_path):
    hang = Hang(airhost, tmp_path, "straggle")
    # A long sampling, then a short one while it runs. Under load the short one may reach the
    # host first (then the long one is the one refused): try again.
    for _ in range(5):
        long = subprocess.Popen([airhost.binary, "stacks", "--sample", "60s"], env=hang.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        time.sleep(1.0)
        done = hang.stacks("--sample", "1s")
        if done.returncode != 0:
            break
        out, err = long.communicate(timeout=30)
        assert "a sampling of this run is under way" in err, (out, err)
    try:
        assert long.poll() is None, long.communicate()
        assert done.returncode == 1 and "a sampling of this run is under way" in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
    finally:
        long.send_signal(signal.SIGINT)  # the user's Ctrl-C on the first
        long.communicate(timeout=30)
    # The sampling ended with its client: the next one is served at once.
    done = wait_for(lambda: (d := hang.stacks("--sample", "500ms")).returncode == 0 and d, 10, "a new sampling served")
    assert done.stdout.startswith("sampled run "), done.stdout
    hang.release().assert_rc(0)


@pytest.mark.parametrize("flags, says", [
    (["--sample"], "--sample takes how long to sample"),
    (["--sample", "5ms"], "out of range"),
    (["--sample", "soon"], "--sample"),
])
def test_a_bad_sampling_length_is_one_line_and_exit_2(airhost, tmp_path, flags, says):
    done = subprocess.run([airhost.binary, "stacks", *flags], env=airhost.env(tmp_path / "runs"), capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


# ---- torch's flight recorder, read back -------------------------------------------------


def test_a_run_that_ends_badly_names_the_rank_missing_from_a_collective_from_the_flight_recorder(airhost, tmp_path):
    # --timeout 25: each rank's dump takes ~2 s of CPU, ~10 s when 2 cores are shared with a loaded suite.
    run = airhost(script("fr_hang.py"), "-n", "3", "--timeout", "25", "--", "self", env={"TORCH_FR_BUFFER_SIZE": "100"})
    run.assert_rc(124)
    assert run.out.count("dumped") == 3, run.describe()
    assert "Flight recorder, torch's ring of recent collectives (ranks 0-2 dumped):" in run.err, run.describe()
    line = ("process group 0 (default_pg): rank 1 never entered collective #4 (gloo:all_reduce) that ranks 0,2 "
            "entered; its last was #3 (gloo:all_reduce)")
    assert line in run.err, run.describe()
    # Before the run directory line, and kept in the run directory.
    assert run.err.index(line) < run.err.index("Run directory: "), run.describe()
    kept = (run.run_dir / "stacks" / "flight-recorder.txt").read_text()
    assert line in kept, kept


def test_a_flight_recorder_dump_that_cannot_be_read_is_said_and_the_rest_still_read(airhost, tmp_path):
    # --timeout 25: each rank's dump takes ~2 s of CPU, ~10 s when 2 cores are shared with a loaded suite.
    run = airhost(script("fr_hang.py"), "-n", "3", "--timeout", "25", "--", "self", env={"TORCH_FR_BUFFER_SIZE": "100"})
    run.assert_rc(124)
    # The same dumps read again, one of them cut short as by a rank that died writing it.
    stacks = run.run_dir / "stacks"
    whole = (stacks / "nccl-trace-rank-2").read_bytes()
    (stacks / "nccl-trace-rank-2").write_bytes(whole[: len(whole) // 2])
    source = (Path(__file__).resolve().parents[2] / "runtime" / "flight_recorder.py").read_text()
    done = subprocess.run([sys.executable, "-I", "-c", source, str(stacks)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "(ranks 0-1 dumped)" in done.stdout and "rank 2: its dump cannot be read" in done.stdout, done.stdout
    assert "rank 1 never entered collective #4" in done.stdout, done.stdout


def test_a_hang_the_watch_finds_asks_the_flight_recorder_for_a_dump_before_the_ranks_are_stopped(airhost, tmp_path):
    # NCCL's monitor thread cannot run here: fr_hang.py's stand-in listens on the pipe as it does.
    run = airhost(script("fr_hang.py"), "-n", "3", "--hang-timeout", "6s", "--on-hang", "stop", "--", "pipe",
                  env={"TORCH_FR_BUFFER_SIZE": "100"}, timeout=90)
    run.assert_rc(124)
    assert "no rank has made progress" in run.err, run.describe()
    assert "asked torch's flight recorder of ranks 0-2 for its recent collectives (NCCL): " in run.err, run.describe()
    assert run.out.count("dumped") == 3, run.describe()  # before the ranks were stopped
    assert "rank 1 never entered collective #4 (gloo:all_reduce) that ranks 0,2 entered" in run.err, run.describe()


# ---- several nodes: node 0 sees the whole job through the node link ----------------------------


def two_nodes(airhost, tmp_path, mode, *flags):
    """Nodes 0 and 1 on 127.0.0.1, 2 ranks each, in hang.py MODE with rank 3 (node 1's second)
    the odd one; returns both once all four ranks are in the group."""
    from conftest import free_port
    port = free_port()
    d = tmp_path / "hang"
    d.mkdir()
    nodes = [airhost.start(script("hang.py"), "-n", "2", "--nnodes", "2", "--node-rank", str(k), "--master-addr",
                           "127.0.0.1", "--master-port", str(port), "--join-timeout", "60", *flags, "--", mode, d,
                           env={"HANG_RANK": "3"}) for k in (0, 1)]
    wait_for(lambda: all((d / f"ready-{r}").exists() for r in range(4)), 60, "all four ranks in the group")
    return nodes, d


def test_stacks_on_node_0_show_every_rank_of_every_node_the_odd_one_on_node_1_first(airhost, tmp_path):
    (n0, n1), d = two_nodes(airhost, tmp_path, "loop")
    env = airhost.env(n0.runs_root)

    def stacks(*args):
        return subprocess.run([airhost.binary, "stacks", *args], env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    def settled():
        done = stacks("--json")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        return data if all("in all_reduce" in r["where"] for r in data["ranks"][:3]) else None
    data = wait_for(settled, 30, "ranks 0-2 waiting in all_reduce")
    ranks = data["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], ranks
    assert [r["node"] for r in ranks] == [0, 0, 1, 1], ranks
    assert all(r["status"] == "answered" and r["pid"] > 0 for r in ranks), ranks
    assert "in load_batch" in ranks[3]["where"], ranks[3]
    assert data["groups"][0]["ranks"] == [3], data["groups"]

    text = stacks()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "4 ranks in 2 groups" in lines[0], text.stdout
    assert lines[1].startswith("rank 3 (node 1, pid ") and "in load_batch" in lines[1], text.stdout
    assert any(line.startswith("ranks 0-2 (node 0, pids ") and "; node 1, pid " in line and "in all_reduce" in line
               for line in lines), text.stdout

    # The sampling too: rank 3's time in load_batch, from node 1's answers, with its CPU.
    sample = stacks("--sample", "2s", "--json")
    assert sample.returncode == 0, sample.stderr
    profile = {r["rank"]: r for r in json.loads(sample.stdout)["ranks"]}
    assert sorted(profile) == [0, 1, 2, 3], profile
    assert profile[3]["node"] == 1 and profile[3]["functions"][0]["function"] == "load_batch", profile[3]
    assert profile[3]["cpu_percent"] > 20, profile[3]  # a busy loop, measured on node 1

    (d / "release").touch()
    r1, r0 = n1.finish(), n0.finish()
    r0.assert_rc(0)
    r1.assert_rc(0)


def test_node_0_watches_the_whole_job_names_the_stuck_rank_on_node_1_and_every_node_ends_124(airhost, tmp_path):
    (n0, n1), d = two_nodes(airhost, tmp_path, "wait", "--hang-timeout", "6s", "--on-hang", "stop", "--grace", "2")
    r0, r1 = n0.finish(timeout=90), n1.finish(timeout=90)
    r0.assert_rc(124)
    r1.assert_rc(124)
    assert "rank 3 is elsewhere" in r0.err and "in wait_for_data" in r0.err, r0.describe()
    assert "ranks 0-2 wait in all_reduce" in r0.err, r0.describe()
    assert "no rank has made progress" not in r1.err.split("node 0")[0], r1.describe()  # node 1 does not watch
    assert r0.run_json["hang"] and r1.run_json["hang"], (r0.run_json, r1.run_json)
    assert "hung" in r1.run_json["message"] and "node 0" in r1.run_json["message"], r1.run_json


def test_stacks_never_touch_the_ranks_own_fault_handlers(airhost, tmp_path):
    # The reader of a rank's stacks must not swap the process's SIGSEGV handler (#32): a rank
    # that turns faulthandler on and off while `airhost stacks` is asked 100 times keeps
    # answering, and faulthandler, enabled at the end, still reports the rank's real crash.
    work = tmp_path / "churn"
    work.mkdir()
    started = airhost.start(script("faulthandler_churn.py"), "-n", "1", "--", work)
    env = airhost.env(started.runs_root)
    wait_for(lambda: (work / "ready-0").exists(), 60, "the rank running")
    answered = 0
    for _ in range(100):
        done = subprocess.run([airhost.binary, "stacks", "--json"], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        rank = json.loads(done.stdout)["ranks"][0]
        answered += rank["answered"]
        if rank["answered"]:  # the churning threads and the main one, each named by its frames
            assert len(rank["threads"]) == 3 and "faulthandler_churn.py" in json.dumps(rank["threads"]), rank
    assert answered >= 95, f"{answered} of 100 answered"
    (work / "release").touch()
    run = started.finish(timeout=60)
    run.assert_rc(139)
    log = run.log(0, "stderr").decode()
    assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
    assert "faulthandler_churn.py" in log


def test_being_watched_cuts_no_blocking_call_short(airhost, tmp_path):
    # #33: stacks were taken by a signal to the rank, which cut short what it was blocked in (a
    # C sleep(16) under --hang-timeout 12s returned after under 5 s). Now a thread of the rank's
    # own takes them: under the densest hang watch (a sample every second) and `airhost stacks`
    # asked over and over, each call returns what it returns under plain python, when it would.
    work = tmp_path / "calls"
    work.mkdir()
    seconds = 2
    started = airhost.start(script("blocking_calls.py"), "-n", "1", "--hang-timeout", "1s", "--on-hang", "report",
                            "--", work, str(seconds))
    env = airhost.env(started.runs_root)
    wait_for(lambda: (work / "ready").exists(), 60, "the rank running")
    asked, seen = 0, set()
    while started.proc.poll() is None:
        done = subprocess.run([airhost.binary, "stacks", "--json"], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            assert any(why in done.stderr for why in ("has ended", "no live run", "ended meanwhile")), done.stderr
            break
        asked += 1
        rank = json.loads(done.stdout)["ranks"][0]
        if rank["answered"]:
            seen.add(rank["where"].rsplit(" in ", 1)[-1])
    run = started.finish(timeout=60)
    run.assert_rc(0)
    assert asked >= 100, f"stacks asked only {asked} times"
    out = run.log(0).decode()
    expected = {"in_c_sleep": "0 errno=0", "in_c_nanosleep": "0 errno=0", "in_c_poll": "0 errno=0",
                "in_c_select": "0 errno=0", "in_c_epoll_wait": "0 errno=0", "in_c_sem_timedwait": "-1 errno=110",
                "in_c_read": "1 errno=0", "in_python_sleep": "0 errno=0", "in_python_select": "0 errno=0"}
    for name, result in expected.items():
        m = re.search(rf"^{name} rc=(.*) took=([\d.]+)$", out, re.M)
        assert m, out
        assert m.group(1) == result and float(m.group(2)) >= seconds - 0.05, f"{name} was cut short: {m.group(0)}"
    # and the stacks named where the rank was (the calls hold the GIL: read without it)
    assert len(seen & set(expected)) >= 5, seen


def test_the_thread_that_reads_a_ranks_stacks_blocks_no_fault_it_could_raise(airhost, tmp_path):
    # #42: the rank's stacks thread blocked every signal, SIGSEGV, SIGBUS, SIGILL and SIGFPE too,
    # and the task it clones for each read inherits that mask: a fault while reading stacks then
    # takes the default action instead of the fault guard's, and on kernels before 5.16 that
    # ends the rank. Signals sent to the process stay blocked in it (they go to the rank's own
    # threads).
    started = airhost.start(script("sleeper.py"), "-n", "1", "--", "--sleep", "60")
    started.wait_printed([0], "ready")
    marker = marker_of(airhost.tmp_path)

    def watcher_masks():
        found = []
        for proc in live_processes(marker=marker):
            for task in Path(f"/proc/{proc.pid}/task").iterdir():
                try:
                    if (task / "comm").read_text().strip() == "airhost-stacks":
                        status = (task / "status").read_text()
                        found.append(int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.M).group(1), 16))
                except (FileNotFoundError, ProcessLookupError):
                    pass
        return found

    masks = wait_for(watcher_masks, 30, "the rank's airhost-stacks thread")
    assert len(masks) == 1, masks
    blocked = {sig for sig in signal.Signals if masks[0] >> (sig - 1) & 1}
    faults = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
    assert not blocked & faults, f"the stacks thread blocks {sorted(s.name for s in blocked & faults)}"
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD} <= blocked, sorted(s.name for s in blocked)
    # And its answers still come.
    done = subprocess.run([airhost.binary, "stacks", "--json"], env=airhost.env(started.runs_root), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and json.loads(done.stdout)["ranks"][0]["answered"], done.stdout + done.stderr
    started.signal(signal.SIGTERM)
    started.finish(timeout=60).assert_rc(143)

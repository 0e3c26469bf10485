"""A reader that stops reading (a pipe nobody reads, a terminal paused with Ctrl-S, a stuck
tee) never stops the supervisor (issue 22): the timeout, SIGTERM and a failing rank still end
the run within their bounds, the logs hold every byte, and once the reader is back one line
says how much of the output it missed. The reader here is a real pipe that the test leaves
unread, and a real `cat` that it SIGSTOPs."""
from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import script, wait_for, wait_until_gone


def start_unread(airhost, *args, runs: Path):
    """airhost with its stdout and stderr on a pipe that nobody reads until the test does."""
    return subprocess.Popen([airhost.binary, *map(str, args)], cwd=airhost.work, env=airhost.env(runs),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def run_json(runs: Path):
    """The run's record once the run has ended (run.json says "running" from the start)."""
    found = list(runs.glob("*/run.json"))
    record = json.loads(found[0].read_text()) if found else None
    return record if record and record["state"] != "running" else None


def finish(proc) -> bytes:
    out, _ = proc.communicate(timeout=60)
    return out


def check_logs_whole(runs: Path, ranks: int):
    """Every rank's log holds its numbered lines with none missing, even those the reader missed."""
    for rank in range(ranks):
        log = next(runs.glob(f"*/logs/rank-{rank}.stdout.log")).read_bytes()
        numbers = [int(m.group(1)) for m in re.finditer(rb"^%d:(\d+):x+$" % rank, log, re.M)]
        assert numbers, f"rank {rank} wrote nothing"
        assert numbers == list(range(len(numbers))), f"rank {rank}'s log lost lines"


@pytest.mark.timeout(120)
def test_the_timeout_fires_on_time_while_nobody_reads_the_output(airhost, tmp_path):
    runs = tmp_path / "runs-timeout"
    t0 = time.monotonic()
    proc = start_unread(airhost, script("firehose.py"), "-n", "2", "--timeout", "4s", "--grace", "2s", runs=runs)
    # The run ends (run.json written) within 2 s of its bound plus the grace, unread output or not.
    wait_for(lambda: run_json(runs) is not None, 4 + 2 + 2 + 3, "run.json, while the output pipe is unread")
    ended = time.monotonic() - t0
    report = run_json(runs)
    assert report["outcome"] == "timed_out", report
    assert ended < 4 + 2 + 2 + 3, f"the run ended {ended:.1f} s after its start"
    out = finish(proc)  # the reader comes back
    assert proc.returncode == 124
    # Said last, once the reader is back: how much it missed, and where all of it is.
    assert re.search(rb"airhost: [\d.]+ MiB of the ranks' output was not shown: the reader of this output did "
                     rb"not keep up \(every byte is in the logs: .*/logs\)\n$", out), out[-2000:]
    check_logs_whole(runs, 2)


@pytest.mark.timeout(120)
def test_sigterm_is_acted_on_within_the_grace_period_while_the_terminal_is_paused(airhost, tmp_path):
    # A terminal paused with Ctrl-S stops reading: a SIGSTOPped `cat` is the same reader.
    runs = tmp_path / "runs-sigterm"
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = subprocess.Popen([airhost.binary, script("firehose.py"), "-n", "2", "--grace", "2s"], cwd=airhost.work,
                            env=airhost.env(runs), stdout=reader.stdin, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        reader.send_signal(signal.SIGSTOP)
        time.sleep(2.0)  # the pipe fills; the ranks keep writing
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: run_json(runs) is not None, 2 + 3, "run.json after SIGTERM, with the reader paused")
        assert time.monotonic() - t0 < 2 + 3
        assert run_json(runs)["outcome"] == "interrupted"
    finally:
        reader.send_signal(signal.SIGCONT)
        proc.wait(timeout=60)
        reader.stdin.close()
        reader.wait(timeout=60)
    assert proc.returncode == 143
    check_logs_whole(runs, 2)


@pytest.mark.timeout(120)
def test_a_failing_rank_stops_the_others_while_nobody_reads_the_output(airhost, tmp_path):
    runs = tmp_path / "runs-failure"
    t0 = time.monotonic()
    proc = start_unread(airhost, script("firehose.py"), "-n", "2", "--grace", "2s", "--", "60", "1", "2",
                        runs=runs)
    wait_for(lambda: run_json(runs) is not None, 2 + 2 + 8, "run.json after rank 1 failed, output unread")
    report = run_json(runs)
    assert report["outcome"] == "failed" and report["root_cause"] == 1, report
    assert time.monotonic() - t0 < 2 + 2 + 8
    finish(proc)
    assert proc.returncode == 1


@pytest.mark.timeout(120)
def test_a_python_caller_that_does_not_read_its_output_keeps_its_memory_flat(tmp_path):
    # The caller's own thread blocks writing to its stdout, which the test leaves unread while
    # two ranks print flat out; what waits for the caller is bounded, and it says what it skipped.
    import sys

    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRHOST_", "MLFLOW_"))}
    env["AIRHOST_RUNS_DIR"] = str(tmp_path / "runs")
    caller = Path(__file__).resolve().parent / "api_scripts" / "unread_caller.py"
    proc = subprocess.Popen([sys.executable, str(caller), "5", str(report)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    # Nobody reads for the ranks' 5 s of output, and 3 s more.
    wait_for(lambda: list((tmp_path / "runs").glob("*/logs/rank-1.stdout.log")), 30, "the ranks to start")
    time.sleep(8)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    seen = json.loads(report.read_text())
    written = sum(len(p.read_bytes()) for p in (tmp_path / "runs").glob("*/logs/rank-*.stdout.log"))
    assert written > 64 << 20, f"the ranks wrote only {written >> 20} MiB: no test of a bound"
    assert seen["peak"] - seen["baseline"] < 48, seen
    assert re.search(rb"airhost: [\d.]+ MiB of the ranks' output was skipped here: it was not read in time "
                     rb"\(every byte is in the logs: .*/logs\)\n", err + out), (err + out)[-2000:]


@pytest.mark.timeout(120)
def test_a_slow_reader_holds_the_ranks_back_and_loses_nothing(airhost, tmp_path):
    # A reader that takes the output slower than the ranks make it, but keeps taking (a pipe
    # into a busy program): as under plain `python`, the ranks wait on their pipes, and every
    # line reaches it. The ranks write far more than the console queue's hard bound (4 x 8 MiB)
    # while the reader is behind; before the host held them back, that much was skipped.
    runs = tmp_path / "runs-slow"
    proc = start_unread(airhost, script("firehose.py"), "-n", "2", "--", "4", runs=runs)
    fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)  # reads of up to 1 MiB
    got = bytearray()
    while True:
        chunk = os.read(proc.stdout.fileno(), 1 << 20)
        if not chunk:
            break
        got += chunk
        time.sleep(0.04)  # about 20 MiB/s at most
    assert proc.wait(timeout=60) == 0
    assert b"skipped" not in got and b"not shown" not in got, got[-2000:]
    written = 0
    for rank in range(2):
        log = next(runs.glob(f"*/logs/rank-{rank}.stdout.log")).read_bytes()
        written += len(log)
        shown = re.findall(rb"^\[rank %d\] (%d:\d+:x+)$" % (rank, rank), got, re.M)
        assert shown == log.splitlines(), f"rank {rank}: {len(shown)} lines shown, {len(log.splitlines())} logged"
    assert written > 40 << 20, f"the ranks wrote only {written >> 20} MiB: the reader was never behind"

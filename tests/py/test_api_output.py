"""Python API: rank output and the caller's signals. Rank lines appear, as they come, in the
caller's sys.stdout/sys.stderr, "[rank N] "-prefixed unless prefix=False; Ctrl-C in the
caller stops every rank and then raises KeyboardInterrupt; a caller that dies takes its
ranks with it."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import Background, run_scenario  # noqa: E402

OUTPUT = _helpers.script("output.py")


@pytest.mark.timeout(60)
def test_rank_lines_land_prefixed_in_the_callers_sys_stdout_and_sys_stderr_objects(api_tmp):
    caller = run_scenario(api_tmp, "output.py", "capture").ok()
    got = caller.result
    assert got["results"] == [0, 1]
    out_lines, err_lines = got["out"].splitlines(), got["err"].splitlines()
    for rank in (0, 1):
        mine = [line for line in out_lines if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] out line 1 of {rank}", f"[rank {rank}] out line 2 of {rank}",
                        f"[rank {rank}] unterminated {rank}"], got["out"]
        assert f"[rank {rank}] err line of {rank}" in err_lines, got["err"]
        assert not any(f"of {rank}" in line for line in err_lines if "err line" not in line)
    # Nothing went around the replaced objects, to the process's real stdout/stderr.
    real_out = [line for line in caller.out.splitlines() if not line.startswith(_helpers.RESULT_TAG)]
    assert not any("[rank" in line for line in real_out) and "[rank" not in caller.err, caller.describe()


@pytest.mark.timeout(60)
def test_prefix_false_forwards_rank_lines_unchanged(api_tmp):
    got = run_scenario(api_tmp, "output.py", "capture", "0").ok().result
    assert sorted(got["out"].splitlines()) == sorted(
        [f"out line {n} of {r}" for r in (0, 1) for n in (1, 2)] + ["unterminated 0", "unterminated 1"])
    assert sorted(got["err"].splitlines()) == ["err line of 0", "err line of 1"]


@pytest.mark.timeout(90)
def test_sigint_to_the_caller_mid_run_tears_the_ranks_down_then_raises_keyboard_interrupt(api_tmp):
    caller = Background(api_tmp, [OUTPUT, "sigint"])
    try:
        caller.wait_output(["[rank 0] started", "[rank 1] started"])
        ranks = _helpers.rank_processes(_helpers.runs_dir(api_tmp), guards=False)
        assert len(ranks) == 2, ranks
        sent, sent_mono = time.time(), time.monotonic()
        caller.signal(signal.SIGINT)
        done = caller.finish(timeout=30).ok()
        exit_seconds = time.monotonic() - sent_mono
    finally:
        caller.kill()
    got = done.result
    assert got["raised"] == "KeyboardInterrupt", got
    assert exit_seconds < 8, f"the caller took {exit_seconds:.1f} s to exit after SIGINT"
    # The ranks were gone by the time KeyboardInterrupt reached the caller's code.
    assert got["ranks_left"] == [], got
    assert got["interrupted_at"] - sent < 5, f"teardown took {got['interrupted_at'] - sent:.1f} s"
    assert _helpers.rank_processes(_helpers.runs_dir(api_tmp)) == []


@pytest.mark.timeout(90)
def test_a_caller_killed_with_sigkill_takes_its_ranks_with_it(api_tmp):
    caller = Background(api_tmp, [OUTPUT, "sleep"])
    try:
        caller.wait_output(["[rank 0] started", "[rank 1] started"])
        procs = _helpers.rank_processes(_helpers.runs_dir(api_tmp), guards=False)
        # Each rank and the `sleep 300` it started, which only the run's guard can end.
        assert sorted(p.endswith(" sleep 300") for p in procs) == [False, False, True, True], procs
        caller.signal(signal.SIGKILL)
        caller.proc.wait(timeout=10)
    finally:
        caller.kill()
    left = _helpers.wait_no_ranks(_helpers.runs_dir(api_tmp), timeout=10)
    assert left == [], "ranks or their children outlived their SIGKILLed caller:\n" + "\n".join(left)

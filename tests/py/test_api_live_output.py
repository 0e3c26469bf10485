"""Python API: a rank's `\\r` progress bar reaches the caller's sys.stderr as it moves and a
partial line shows before its end (issue 17), as with the CLI (test_live_output.py); ranks
are told the width of the caller's terminal."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import PYTHON, RESULT_TAG, base_env, run_scenario, script  # noqa: E402

STEPS, SECONDS = 15, 3.0


@pytest.mark.timeout(90)
def test_a_bar_and_a_prompt_reach_the_callers_streams_as_they_come(api_tmp):
    got = run_scenario(api_tmp, "live_output.py", "bar").ok().result
    assert got["results"] == [0, 1]
    for rank in (0, 1):
        reads = [(t, text.count("step")) for t, text in got["err"] if f"rank {rank} step" in text]
        assert len(reads) >= 5, f"rank {rank}'s {STEPS + 1} redraws came in {len(reads)} writes: {reads}"
        assert max(n for _, n in reads) <= (STEPS + 1) // 2, reads
        assert reads[-1][0] - reads[0][0] >= SECONDS / 2, reads
    # Every console line holds one rank's redraws, each under its prefix.
    for line in "".join(text for _, text in got["err"]).split("\n"):
        if line:
            ranks = {m.group(1) for m in re.finditer(r"\[rank (\d)\] rank (\d) step \d\d/15", line)}
            assert len(ranks) == 1 and all(s.startswith("[rank ") for s in line.split("\r")), line
    # The prompt showed long before its end, which went on without a second prefix.
    assert "".join(text for _, text in got["out"]) == "[rank 0] Password: ok\n", got["out"]
    # Times of the reads in which the text so far first held each part (under load "ok" and its
    # newline may come in reads of their own).
    def first_holding(part):
        so_far = ""
        for t, text in got["out"]:
            so_far += text
            if part in so_far:
                return t
        raise AssertionError(f"{part!r} never came: {got['out']}")
    shown_at = first_holding("Password: ")
    ended_at = first_holding("ok\n")
    assert ended_at - shown_at >= 1.0, got["out"]


@pytest.mark.timeout(90)
def test_ranks_are_told_the_callers_terminal_width_less_their_prefix(api_tmp):
    """The caller's sys.stdout is a 100 x 30 terminal: ranks get COLUMNS 91 ("[rank 1] " takes
    9), LINES 30, TQDM_NCOLS 90, and their own stdout is still a pipe."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = base_env(api_tmp)
    for name in ("COLUMNS", "LINES", "TQDM_NCOLS"):
        env.pop(name, None)
    proc = subprocess.Popen([PYTHON, script("live_output.py"), "size"], cwd=api_tmp, env=env, stdout=slave,
                            stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    shown = b""
    try:
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the caller closed the terminal
                break
            if not data:
                break
            shown += data
        assert proc.wait(timeout=60) == 0, shown
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    report = next(line for line in shown.decode().splitlines() if line.startswith(RESULT_TAG))
    told = json.loads(report[len(RESULT_TAG):])
    assert told == [["91", "30", "90", False]] * 2, shown

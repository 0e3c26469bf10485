"""Python API: a rank's `\\r` progress bar reaches the caller's sys.stderr as it moves and a
partial line shows before its end (issue 17), as with the CLI (test_live_output.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import run_scenario  # noqa: E402

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
    shown_at = next(t for t, text in got["out"] if "Password: " in text)
    ended_at = next(t for t, text in got["out"] if "ok\n" in text)
    assert ended_at - shown_at >= 1.0, got["out"]

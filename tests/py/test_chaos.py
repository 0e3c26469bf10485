"""The chaos campaign's CI slice (issue 42): bench/chaos.py, 12 rounds from a fixed seed, jobs of
3-4 airhosts on 127.0.0.1 with one fault each (a rank's crash, SIGKILL/SIGTERM/SIGSTOP of a host,
node 0 included, a flood of idle connections, a held newcomer that dies), every invariant checked
after each round: exit codes by the contract, every host out within its bound, no process left,
every run.json final, no line lost from a rank's log. The full campaign (200 rounds, up to 8
hosts) is `bench/chaos.py` itself."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_twelve_rounds_of_faults_break_no_invariant(airhost_bin, tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--rounds", "12", "--seed", "42",
                        "--max-hosts", "4", "--airhost", str(airhost_bin), "--json-file", str(tmp_path / "chaos.json")],
                       capture_output=True, text=True, timeout=220)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "chaos: 0 violation(s) in 0 round(s)" in r.stdout, r.stdout
    import json

    rounds = json.loads((tmp_path / "chaos.json").read_text())["rounds"]
    assert len(rounds) == 12
    # The seed draws faults of several kinds, static and elastic jobs: the slice is not 12 quiet rounds.
    assert len({x["fault"] for x in rounds}) >= 4 and {x["kind"] for x in rounds} == {"static", "elastic"}, rounds

"""The DDP example trains to convergence on 4 CPU ranks (gloo), as a script and as a
function target."""
import pickle
import re

import pytest

from conftest import REPO, split_lines

pytestmark = pytest.mark.timeout(150)

EXAMPLE = str(REPO / "examples" / "mlp_ddp.py")
EPOCH_RE = re.compile(rb"^epoch (\d+)/(\d+)  loss (\d+\.\d+)$")


def epoch_losses(log: bytes) -> list[float]:
    losses = []
    for line in split_lines(log):
        m = EPOCH_RE.match(line)
        if m:
            assert int(m.group(1)) == len(losses) + 1
            losses.append(float(m.group(3)))
    return losses


def test_the_ddp_example_converges_on_four_cpu_ranks(airhost):
    run = airhost(EXAMPLE, "--accelerators", "4", timeout=140)
    run.assert_rc(0)
    assert re.search(rf"airhost: run {run.run_id}: 4 rank\(s\) succeeded in ", run.err), run.describe()
    assert [r["state"] for r in run.ranks] == ["succeeded"] * 4
    log0 = run.log(0)
    losses = epoch_losses(log0)
    assert len(losses) == 5, log0
    final = re.search(rb"^final loss (\d+\.\d+)$", log0, re.M)
    assert final, log0
    final_loss = float(final.group(1))
    assert final_loss == losses[-1]
    assert final_loss < 0.05, f"did not converge: {losses}"
    assert final_loss < losses[0]
    assert b"[rank 0] final loss " in run.stdout
    # only rank 0 prints; the others' logs are empty (no warnings, no errors)
    for n in (1, 2, 3):
        assert run.log(n) == b""
    run.assert_console_matches_logs()


def test_the_ddp_example_main_returns_the_same_final_loss_on_every_rank(airhost):
    run = airhost(f"{EXAMPLE}:main", "--accelerators", "4", timeout=140)
    run.assert_rc(0)
    assert all(r["state"] == "succeeded" and r["has_result"] for r in run.ranks)
    results = []
    for n in range(4):
        with open(run.run_dir / "results" / f"rank-{n}.pkl", "rb") as f:
            results.append(pickle.load(f))
    assert all(isinstance(v, float) for v in results), results
    assert len(set(results)) == 1, f"ranks disagree on the final loss: {results}"
    losses = epoch_losses(run.log(0))
    assert len(losses) == 5
    assert results[0] < 0.05 and results[0] < losses[0]
    assert f"{results[0]:.5f}".encode() in run.log(0)  # the last epoch line shows the returned loss
    run.assert_console_matches_logs()

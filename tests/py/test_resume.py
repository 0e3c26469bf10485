"""A three-day run survives a crash: a rank SIGKILLed in the middle of DDP training is restarted
by airhost (--max-restarts), the group resumes from the last complete checkpoint written with
airhost.data.VolumeWriter, and ends with exactly the parameters of an uninterrupted run with the
same seed."""
import os
import signal
from pathlib import Path

import pytest

from conftest import wait_for

pytestmark = pytest.mark.timeout(300)

TRAIN = str(Path(__file__).resolve().parent / "restart_scripts" / "train_resume.py")


def test_a_rank_killed_mid_training_is_restarted_and_resumes_to_the_same_parameters(airhost, tmp_path):
    import torch

    # The reference: the same training, never interrupted.
    ref_dir = tmp_path / "ckpt-ref"
    ref_dir.mkdir()
    ref = airhost(TRAIN, "-n", "2", "--", "--ckpt", ref_dir, "--out", tmp_path / "ref.pt", timeout=150)
    ref.assert_rc(0)
    assert b"attempt 0: starting from scratch" in ref.log(0)

    # The same run, with rank 1 SIGKILLed at step 17: the last complete checkpoint is step 15.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    host = airhost.start(TRAIN, "-n", "2", "--max-restarts", "2", "--grace", "5",
                         "--", "--ckpt", ckpt, "--out", tmp_path / "resumed.pt", "--stall-at", "17")
    stalled = wait_for(lambda: (ckpt / "stalled").exists() and (ckpt / "stalled").read_text(), 120,
                       "rank 1 to reach step 17")
    os.kill(int(stalled), signal.SIGKILL)
    run = host.finish(timeout=150)
    run.assert_rc(0)
    j = run.run_json
    assert j["restarts"] == 1, j
    assert "rank 1 was killed by SIGKILL" in j["failed_attempts"][0], j["failed_attempts"]
    assert "restarting all 2 rank(s) (restart 1 of 2)" in run.err
    log0 = run.log(0).decode()
    assert "attempt 0: starting from scratch" in log0
    assert "attempt 1: resumed from step-000015 at step 15" in log0, log0
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-")) == [
        "step-000005", "step-000010", "step-000015", "step-000020", "step-000025"]

    expected = torch.load(tmp_path / "ref.pt")
    got = torch.load(tmp_path / "resumed.pt")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after the resume"

"""Restarts across nodes (issue 18): with --max-restarts on several nodes, a rank that fails
on any node stops every node's ranks, and all of them start again together, with the same
TORCHELASTIC_RESTART_COUNT, master port and run directory on each node; a DDP run whose rank
on node 1 is SIGKILLed mid-training resumes from its checkpoint to exactly the parameters of
an uninterrupted run. Two airhosts on 127.0.0.1, 2 ranks each; real gloo."""
import os
import re
import signal
from pathlib import Path

import pytest

from conftest import free_port, script, wait_for

pytestmark = pytest.mark.timeout(300)

RESTART_SCRIPTS = Path(__file__).resolve().parent / "restart_scripts"
FLAKY = str(RESTART_SCRIPTS / "flaky.py")
TRAIN = str(RESTART_SCRIPTS / "train_resume.py")
COMMON = ("--node-timeout", "5", "--grace", "3", "--join-timeout", "60")


def two_nodes(airhost, target, *args, script_args=(), n=2):
    port = free_port()
    started = []
    for rank in (0, 1):
        started.append(airhost.start(target, "-n", str(n), "--nnodes", "2", "--node-rank", str(rank), "--master-addr",
                                     "127.0.0.1", "--master-port", str(port), *COMMON, *args, "--", *script_args))
    return started


def attempts_of(run):
    """{global rank: [attempts it printed]} from flaky.py's lines."""
    seen = {}
    for rank, lines in run.console().items():
        seen[rank] = [int(m.group(1)) for line in lines if (m := re.search(rb"attempt (\d+) of max", line))]
    return seen


def test_a_rank_failing_on_node_0_restarts_every_node_together(airhost):
    n0, n1 = two_nodes(airhost, FLAKY, "--max-restarts", "2", script_args=("--fail-until", "1"))
    r0, r1 = n0.finish(timeout=90), n1.finish(timeout=90)
    r0.assert_rc(0)
    r1.assert_rc(0)
    assert attempts_of(r0) == {0: [0, 1], 1: [0, 1]}, r0.describe()
    assert attempts_of(r1) == {2: [0, 1], 3: [0, 1]}, r1.describe()
    ports = {m for run in (r0, r1) for lines in run.console().values() for line in lines
             for m in re.findall(rb"port (\d+)", line)}
    assert len(ports) == 1, ports  # rank 0's store bound the same port again
    assert "run %s failed: rank 1 exited with code 3; restarting all 2 rank(s) (restart 1 of 2)" % r0.run_id in r0.err
    assert re.search(r"node 0 \([^)]+\) failed: rank 1 exited with code 3; this node's ranks were stopped; "
                     r"restarting all 2 rank\(s\) \(restart 1 of 2\)", r1.err), r1.err
    for run in (r0, r1):
        assert run.run_json["restarts"] == 1 and run.run_json["outcome"] == "succeeded"


def test_restarts_used_up_end_the_job_with_the_failures_code_on_its_node_and_138_elsewhere(airhost):
    n0, n1 = two_nodes(airhost, FLAKY, "--max-restarts", "1", script_args=("--fail-until", "9", "--code", "7"))
    r0, r1 = n0.finish(timeout=90), n1.finish(timeout=90)
    r0.assert_rc(7)
    r1.assert_rc(138)
    assert attempts_of(r0)[0] == [0, 1] and attempts_of(r1)[2] == [0, 1]
    assert "no restart left" in r0.run_json["message"], r0.run_json
    assert re.search(r"node 0 \([^)]+\) failed: rank 1 exited with code 7", r1.run_json["message"]), r1.run_json


def test_an_interrupted_node_ends_the_job_without_a_restart(airhost):
    # Ranks that sleep once they no longer fail: SIGTERM on node 1 in attempt 0 of a job that
    # would otherwise not fail at all is the caller saying stop, on every node.
    n0, n1 = two_nodes(airhost, FLAKY, "--max-restarts", "3", script_args=("--fail-until", "0", "--then-sleep", "60"))
    wait_for(lambda: all(n.out_path.read_bytes().count(b"attempt 0 of max") == 2 for n in (n0, n1)), 60,
             "every rank to start")
    n1.signal(signal.SIGTERM)
    r1, r0 = n1.finish(timeout=60), n0.finish(timeout=60)
    r1.assert_rc(143)
    r0.assert_rc(138)
    assert "restarting" not in r0.err + r1.err
    assert attempts_of(r0) == {0: [0], 1: [0]}


def test_a_rank_killed_on_node_1_mid_training_resumes_on_both_nodes_to_the_same_parameters(airhost, tmp_path):
    # One rank per node: with a world of 2 every gradient sum is a + b, exact in any order. With
    # 4 ranks a resumed DDP run differs from an uninterrupted one in the last bit (3e-8) on one
    # node as on two, bit for bit the same: DDP rebuilds its gradient bucket after the first
    # step of a process, which for a resumed run is step 15, not 0, and the ring all-reduce
    # then adds 4 partial sums in another order. That is DDP's, not the restart's.
    import torch

    ref_dir = tmp_path / "ckpt-ref"
    ref_dir.mkdir()
    ref = two_nodes(airhost, TRAIN, n=1, script_args=("--ckpt", ref_dir, "--out", tmp_path / "ref.pt"))
    for run in (ref[1].finish(timeout=150), ref[0].finish(timeout=150)):
        run.assert_rc(0)

    # Rank 1, on node 1, is SIGKILLed at step 17: the last complete checkpoint is step 15.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    n0, n1 = two_nodes(airhost, TRAIN, "--max-restarts", "2", n=1, script_args=(
        "--ckpt", ckpt, "--out", tmp_path / "resumed.pt", "--stall-at", "17", "--stall-rank", "1"))
    stalled = wait_for(lambda: (ckpt / "stalled").exists() and (ckpt / "stalled").read_text(), 120,
                       "rank 1 to reach step 17")
    os.kill(int(stalled), signal.SIGKILL)
    r1, r0 = n1.finish(timeout=150), n0.finish(timeout=150)
    r0.assert_rc(0)
    r1.assert_rc(0)
    assert "rank 1 was killed by SIGKILL" in r1.run_json["failed_attempts"][0], r1.run_json
    assert "node 1" in r0.run_json["failed_attempts"][0], r0.run_json
    assert r0.run_json["restarts"] == r1.run_json["restarts"] == 1
    log0 = r0.log(0).decode()
    assert "attempt 1: resumed from step-000015 at step 15" in log0, log0
    expected, got = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "resumed.pt")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after the resume across nodes"


# ---- a node whose airhost is lost comes back (issue 18) ----------------------------------------

def node(airhost, port, rank, target, *args, script_args=(), n=2):
    return airhost.start(target, "-n", str(n), "--nnodes", "2", "--node-rank", str(rank), "--master-addr",
                         "127.0.0.1", "--master-port", str(port), *COMMON, *args, "--", *script_args)


def test_a_lost_node_comes_back_within_join_timeout_and_the_group_restarts_with_it(airhost):
    # Node 1's airhost is SIGKILLed (its ranks die with it) while every rank sleeps in attempt
    # 0. Node 0 stops its ranks, waits on the port again, refuses a node that does not fit the
    # job, and takes node 1 back when its airhost is started again with the same arguments: both
    # nodes then run attempt 1, and the job succeeds.
    port = free_port()
    flaky = ("--fail-until", "0", "--then-sleep", "4")
    n0 = node(airhost, port, 0, FLAKY, "--max-restarts", "1", script_args=flaky + ("--then-sleep-once", "60"))
    n1 = node(airhost, port, 1, FLAKY, "--max-restarts", "1", script_args=flaky + ("--then-sleep-once", "60"))
    wait_for(lambda: all(n.out_path.read_bytes().count(b"attempt 0 of max") == 2 for n in (n0, n1)), 60,
             "every rank to start")
    n1.signal(signal.SIGKILL)
    n1.finish(timeout=30)  # its ranks went with it
    wait_for(lambda: b"to come back" in n0.err_path.read_bytes(), 60, "node 0 to wait for node 1")
    assert b"waiting up to 60 s (join_timeout) for node 1" in n0.err_path.read_bytes(), n0.err_path.read_bytes()

    wrong = node(airhost, port, 1, FLAKY, "--max-restarts", "1", n=3, script_args=flaky)
    w = wrong.finish(timeout=60)
    w.assert_rc(2)
    assert "the nodes disagree on the ranks per node" in w.err, w.err

    back = node(airhost, port, 1, FLAKY, "--max-restarts", "1", script_args=flaky + ("--then-sleep-once", "60"))
    r0, rb = n0.finish(timeout=90), back.finish(timeout=90)
    r0.assert_rc(0)
    rb.assert_rc(0)
    assert attempts_of(r0) == {0: [0, 1], 1: [0, 1]}, r0.describe()
    assert attempts_of(rb) == {2: [1], 3: [1]}, rb.describe()  # it joined the group's attempt 1
    assert re.search(r"node 1 \([^)]+\) was lost: its connection closed", r0.run_json["failed_attempts"][0]), r0.run_json
    assert re.search(r"node 1 \([^)]+\) came back", r0.err), r0.err
    assert "refused node 1" in r0.err and "ranks per node" in r0.err, r0.err
    assert "came back to the job" in rb.err and "restart 1" in rb.err, rb.err
    assert r0.run_json["restarts"] == rb.run_json["restarts"] == 1


def test_a_node_whose_airhost_is_killed_mid_training_comes_back_and_the_job_ends_as_if_uninterrupted(
        airhost, tmp_path):
    # Node 1's airhost is SIGKILLed while its rank is at step 17 and started again at once, as
    # Kubernetes restarts a pod: its hello may reach rank 0's store before node 0 has stopped
    # its ranks, and it tries again until node 0 listens. Both nodes resume from step 15.
    import torch

    ref_dir = tmp_path / "ckpt-ref"
    ref_dir.mkdir()
    ref = two_nodes(airhost, TRAIN, n=1, script_args=("--ckpt", ref_dir, "--out", tmp_path / "ref.pt"))
    for run in (ref[1].finish(timeout=150), ref[0].finish(timeout=150)):
        run.assert_rc(0)

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    port = free_port()
    train = ("--ckpt", ckpt, "--out", tmp_path / "resumed.pt", "--stall-at", "17", "--stall-rank", "1")
    n0 = node(airhost, port, 0, TRAIN, "--max-restarts", "2", n=1, script_args=train)
    n1 = node(airhost, port, 1, TRAIN, "--max-restarts", "2", n=1, script_args=train)
    wait_for(lambda: (ckpt / "stalled").exists() and (ckpt / "stalled").read_text(), 120, "rank 1 to reach step 17")
    n1.signal(signal.SIGKILL)
    n1.finish(timeout=30)
    back = node(airhost, port, 1, TRAIN, "--max-restarts", "2", n=1, script_args=train)
    r0, rb = n0.finish(timeout=150), back.finish(timeout=150)
    r0.assert_rc(0)
    rb.assert_rc(0)
    assert r0.run_json["restarts"] == rb.run_json["restarts"] == 1
    assert "attempt 1: resumed from step-000015 at step 15" in r0.log(0).decode()
    expected, got = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "resumed.pt")
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after node 1 came back"


def test_three_nodes_wait_for_the_lost_one_and_restart_together_when_it_comes_back(airhost):
    port = free_port()
    sargs = ("--fail-until", "0", "--then-sleep", "2", "--then-sleep-once", "60")

    def start(rank):
        return airhost.start(FLAKY, "-n", "1", "--nnodes", "3", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), *COMMON, "--max-restarts", "1", "--", *sargs)

    nodes = [start(r) for r in range(3)]
    wait_for(lambda: all(n.out_path.read_bytes().count(b"attempt 0 of max") == 1 for n in nodes), 60,
             "every rank to start")
    nodes[2].signal(signal.SIGKILL)
    nodes[2].finish(timeout=30)
    wait_for(lambda: b"to come back" in nodes[0].err_path.read_bytes(), 60, "node 0 to wait for node 2")
    nodes[2] = start(2)
    runs = [n.finish(timeout=60) for n in nodes]
    for run in runs:
        run.assert_rc(0)
        assert run.run_json["restarts"] == 1, run.run_json
    assert attempts_of(runs[0]) == {0: [0, 1]} and attempts_of(runs[1]) == {1: [0, 1]}
    assert attempts_of(runs[2]) == {2: [1]}, runs[2].describe()
    assert re.search(r"node 2 \([^)]+\) was lost", runs[1].run_json["failed_attempts"][0]), runs[1].run_json


def test_a_lost_node_that_does_not_come_back_ends_the_job_with_138_naming_it(airhost):
    port = free_port()
    args = ("--max-restarts", "2", "--join-timeout", "5")
    n0 = node(airhost, port, 0, FLAKY, *args, script_args=("--fail-until", "0", "--then-sleep", "60"))
    n1 = node(airhost, port, 1, FLAKY, *args, script_args=("--fail-until", "0", "--then-sleep", "60"))
    wait_for(lambda: all(n.out_path.read_bytes().count(b"attempt 0 of max") == 2 for n in (n0, n1)), 60,
             "every rank to start")
    n1.signal(signal.SIGKILL)
    n1.finish(timeout=30)
    r0 = n0.finish(timeout=60)
    r0.assert_rc(138)
    assert "node 1 did not come back within 5 s (join_timeout)" in r0.err, r0.err
    assert re.search(r"node 1 \([^)]+\) was lost", r0.run_json["message"]), r0.run_json
    assert r0.seconds < 45, r0.seconds  # node_timeout 5 + join_timeout 5, and start-up


def test_node_0_interrupted_while_it_waits_for_a_lost_node_ends_by_the_signal(airhost):
    port = free_port()
    args = ("--max-restarts", "2")
    n0 = node(airhost, port, 0, FLAKY, *args, script_args=("--fail-until", "0", "--then-sleep", "60"))
    n1 = node(airhost, port, 1, FLAKY, *args, script_args=("--fail-until", "0", "--then-sleep", "60"))
    wait_for(lambda: all(n.out_path.read_bytes().count(b"attempt 0 of max") == 2 for n in (n0, n1)), 60,
             "every rank to start")
    n1.signal(signal.SIGKILL)
    n1.finish(timeout=30)
    wait_for(lambda: b"to come back" in n0.err_path.read_bytes(), 60, "node 0 to wait for node 1")
    n0.signal(signal.SIGTERM)
    r0 = n0.finish(timeout=20)
    r0.assert_rc(143)
    assert r0.run_json["outcome"] == "interrupted", r0.run_json
    assert "interrupted by SIGTERM while the nodes waited to restart" in r0.run_json["message"], r0.run_json

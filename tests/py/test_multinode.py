"""Several nodes on this machine: two airhosts on 127.0.0.1, one with --node-rank 0 and one
with --node-rank 1, form one world; the nodes' disagreements and bad input are errors on
every node before any rank starts; a node that fails, is killed, frozen or interrupted makes
the other end within node_timeout, naming it, with no process left. (tests/py/test_netns.py
does the same across two network namespaces.)"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import free_port, live_processes, script, start_light_nodes, wait_for, wait_until_gone

pytestmark = pytest.mark.timeout(90)

NODE_TIMEOUT = 3  # tight, so that the tests of a lost node are quick
COMMON = ("--node-timeout", str(NODE_TIMEOUT), "--grace", "2", "--join-timeout", "60")


def node(airhost, rank, port, *args, nnodes=2, n=2, script_args=()):
    return airhost.start(*args, "-n", str(n), "--nnodes", str(nnodes), "--node-rank", str(rank),
                         "--master-addr", "127.0.0.1", "--master-port", str(port), *COMMON,
                         *(("--", *script_args) if script_args else ()))


def wait_ready(started, ranks):
    started.wait_printed(ranks, "ready", timeout=60)


def two_nodes_in_a_collective_loop(airhost):
    """Nodes 0 and 1 on 127.0.0.1, 2 ranks each, all four in collective_loop.py and ready."""
    port = free_port()
    loop = script("collective_loop.py")
    n0 = node(airhost, 0, port, loop)
    n1 = node(airhost, 1, port, loop)
    wait_ready(n0, [0, 1])
    wait_ready(n1, [2, 3])
    return n0, n1


def host_lines(run):
    return [line for line in run.err.splitlines() if line.startswith("airhost: ")]


# ---- one world ------------------------------------------------------------------------------


def test_two_nodes_form_one_world_of_four_ranks(airhost):
    port = free_port()
    n0 = node(airhost, 0, port, script("node_world.py"))
    n1 = node(airhost, 1, port, script("node_world.py"))
    r1, r0 = n1.finish(), n0.finish()
    r0.assert_rc(0)
    r1.assert_rc(0)
    seen = {}
    for run, node_rank in ((r0, 0), (r1, 1)):
        for rank, lines in run.console().items():
            m = re.fullmatch(rb"rank (\d) local (\d) group (\d) world (\d) local_world (\d) nodes (\d) port (\d+) "
                             rb"sum (\d+) dist_rank (\d)", lines[0])
            assert m, lines
            r, local, group, world, local_world, nodes, p, total, dist_rank = map(int, m.groups())
            assert (r, group, world, local_world, nodes, p, total, dist_rank) == \
                (rank, node_rank, 4, 2, 2, port, 10, rank), lines[0]
            assert r == node_rank * 2 + local
            seen[r] = node_rank
        assert [r["rank"] for r in run.ranks] == [node_rank * 2, node_rank * 2 + 1]
        assert run.run_json["nnodes"] == 2 and run.run_json["node_rank"] == node_rank
    assert seen == {0: 0, 1: 0, 2: 1, 3: 1}
    assert any("all 2 nodes joined (node 1 (" in line for line in host_lines(r0)), r0.err
    assert any("all 2 nodes joined at node 0 (" in line for line in host_lines(r1)), r1.err
    # No token: the join is open, as before, and node 0 says so once.
    assert sum("the join is open" in line for line in host_lines(r0)) == 1, r0.err


def test_node_1_may_start_first_and_waits_for_node_0(airhost):
    port = free_port()
    n1 = node(airhost, 1, port, script("node_world.py"))
    time.sleep(1.5)
    n0 = node(airhost, 0, port, script("node_world.py"))
    r0, r1 = n0.finish(), n1.finish()
    r0.assert_rc(0)
    r1.assert_rc(0)
    assert f"airhost: node 1 of 2: waiting for node 0 at 127.0.0.1:{port} (Connection refused)" in r1.err


# ---- the nodes disagree, or the input is bad ----------------------------------------------------


@pytest.mark.parametrize("what", ["ranks per node", "number of nodes"])
def test_nodes_that_disagree_both_exit_2_naming_who_said_what(airhost, what):
    port = free_port()
    n0 = node(airhost, 0, port, script("node_world.py"))
    if what == "ranks per node":
        n1 = node(airhost, 1, port, script("node_world.py"), n=1)
        expected = re.compile(r"the nodes disagree on the ranks per node: node 0 \([^)]+\) runs 2, "
                              r"node 1 \([^)]+, 127\.0\.0\.1\) runs 1; every node must run the same number")
    else:
        n1 = node(airhost, 1, port, script("node_world.py"), nnodes=3)
        expected = re.compile(r"the nodes disagree on the number of nodes: node 0 \([^)]+\) was given --nnodes 2, "
                              r"the node on \S+ \(127\.0\.0\.1\) --nnodes 3; give every node the same --nnodes")
    r0, r1 = n0.finish(timeout=30), n1.finish(timeout=30)
    for run in (r0, r1):
        run.assert_rc(2)
        assert expected.search(run.err), run.describe()
        assert not run.run_json, "no rank may have started"
        assert "[rank " not in run.out + run.err
    assert r0.seconds < 15 and r1.seconds < 15


@pytest.mark.parametrize("args, message", [
    (("--nnodes", "2", "--node-rank", "2", "--master-port", "29555"),
     "airhost: --node-rank 2 is out of range for --nnodes 2: node ranks go from 0 to 1"),
    (("--nnodes", "0"), "airhost: --nnodes must be a positive integer (the number of nodes), or MIN:MAX for an "
                        "elastic job (1 <= MIN <= MAX), got '0'"),
    (("--nnodes", "2", "--node-rank", "1", "--master-port", "29555", "--master-addr", "no-such-host.invalid"),
     "airhost: master address 'no-such-host.invalid' does not resolve ("),
    (("--nnodes", "2", "--node-rank", "1"), "airhost: with --nnodes 2, give --master-port: every node must be "
                                            "given the same port, where node 0 listens"),
    (("--nnodes", "2", "--node-timeout", "0", "--master-port", "29555"),
     "airhost: --node-timeout must be at least 1 second, got '0'"),
])
def test_bad_multi_node_input_is_a_clear_error_and_starts_nothing(airhost, args, message):
    run = airhost(script("node_world.py"), *args, timeout=30)
    run.assert_rc(2)
    assert message in run.err, run.describe()
    assert not run.run_json
    assert run.seconds < 10


def test_a_master_port_in_use_on_node_0_is_named(airhost):
    with socket.socket() as other:
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        run = airhost(script("node_world.py"), "-n", "2", "--nnodes", "2", "--master-port", str(port), timeout=30)
    run.assert_rc(2)
    assert f"cannot reserve master port {port}: Address already in use; pick another --master-port and give it " \
           "to every node" in run.err, run.describe()
    assert "[rank " not in run.out + run.err


def test_a_node_that_finds_no_node_0_gives_up_at_the_join_timeout(airhost):
    port = free_port()
    run = airhost(script("node_world.py"), "-n", "1", "--nnodes", "2", "--node-rank", "1", "--master-port", str(port),
                  "--join-timeout", "2", timeout=30)
    run.assert_rc(138)
    assert f"node 0 did not answer at 127.0.0.1:{port} within 2 s (join_timeout; last: Connection refused)" in run.err
    assert run.run_json["outcome"] == "node_lost" and run.run_json["ranks"] == []
    assert run.seconds < 10


# ---- a node fails, is lost or is stopped ---------------------------------------------------------


def assert_gone_quickly(run, bound):
    assert run.seconds < bound, f"took {run.seconds:.1f} s\n{run.describe()}"


def test_a_rank_failing_on_node_1_stops_node_0_naming_node_and_rank(airhost):
    port = free_port()
    loop = script("collective_loop.py")
    n0 = node(airhost, 0, port, loop)
    n1 = node(airhost, 1, port, loop, script_args=("--fail-rank", "3", "--fail-after", "1"))
    r1, r0 = n1.finish(), n0.finish()
    r1.assert_rc(1)
    assert f"run {r1.run_id} failed: rank 3 exited with code 1 (ValueError: boom on rank 3)" in r1.err
    r0.assert_rc(138)
    assert re.search(rf"airhost: run {r0.run_id}: node 1 \([^)]+\) failed: rank 3 exited with code 1 "
                     r"\(ValueError: boom on rank 3\); this node's ranks were (stopped|failed or were stopped as a "
                     r"consequence)", r0.err), r0.describe()
    assert r0.run_json["outcome"] == "node_lost" and r0.run_json["exit_code"] == 138
    assert r0.run_json["root_cause"] == -1
    assert "Root cause:" not in r0.err  # the cause is on node 1, not a rank here


def test_killing_node_1s_airhost_ends_node_0_at_once(airhost):
    n0, n1 = two_nodes_in_a_collective_loop(airhost)
    run_dir_1 = n1.run_dir()
    t0 = time.monotonic()
    n1.signal(signal.SIGKILL)
    r0 = n0.finish(timeout=30)
    ended = time.monotonic() - t0
    r0.assert_rc(138)
    assert ended < NODE_TIMEOUT, f"a closed connection is a lost node at once, took {ended:.1f} s"
    assert re.search(r"node 1 \([^)]+, 127\.0\.0\.1\) was lost: its connection closed \(its airhost exited or was "
                     r"killed\); this node's ranks were stopped", r0.err), r0.describe()
    r1 = n1.finish(timeout=10, check_processes=False)
    assert r1.rc == -signal.SIGKILL
    left = wait_until_gone(run_id=run_dir_1.name, timeout=5)
    assert not left, "node 1's ranks outlived its airhost:\n" + "\n".join(map(str, left))


def test_a_frozen_node_is_lost_after_node_timeout_and_both_end(airhost):
    n0, n1 = two_nodes_in_a_collective_loop(airhost)
    t0 = time.monotonic()
    n1.signal(signal.SIGSTOP)  # its airhost sends no heartbeat; its connection stays open
    try:
        r0 = n0.finish(timeout=30)
    finally:
        n1.signal(signal.SIGCONT)
    ended = time.monotonic() - t0
    r0.assert_rc(138)
    # Silence counts from its last heartbeat, up to 1 s before the SIGSTOP; then the grace.
    assert NODE_TIMEOUT - 1.5 < ended < NODE_TIMEOUT + 2 + 3, f"ended after {ended:.1f} s"
    assert re.search(rf"node 1 \([^)]+, 127\.0\.0\.1\) was lost: nothing heard from it for {NODE_TIMEOUT} s "
                     r"\(node_timeout\); this node's ranks were stopped", r0.err), r0.describe()
    # Node 1, thawed, finds node 0 gone (it said why first) and ends as well.
    r1 = n1.finish(timeout=30)
    r1.assert_rc(138)
    assert re.search(rf"airhost: run {r1.run_id}: node 0 \([^)]+\) stopped its ranks \(node 1 \([^)]+\) was lost: "
                     rf"nothing heard from it for {NODE_TIMEOUT} s \(node_timeout\)\)", r1.err), r1.describe()


def test_an_interrupted_node_0_stops_node_1_saying_so(airhost):
    n0, n1 = two_nodes_in_a_collective_loop(airhost)
    n0.signal(signal.SIGTERM)
    r0, r1 = n0.finish(timeout=30), n1.finish(timeout=30)
    r0.assert_rc(143)
    r1.assert_rc(138)
    assert re.search(rf"airhost: run {r1.run_id}: node 0 \([^)]+\) was interrupted by SIGTERM; this node's ranks "
                     r"were (stopped|failed or were stopped as a consequence)", r1.err), r1.describe()


def test_a_frozen_node_0_is_lost_by_node_1_and_no_frame_arrives_corrupted(airhost):
    """The other direction of the test above: node 1 is the one left, and the link writes from
    a buffer (never a frame in part), so neither node, node 0 thawed included, reads garbage."""
    n0, n1 = two_nodes_in_a_collective_loop(airhost)
    t0 = time.monotonic()
    n0.signal(signal.SIGSTOP)
    try:
        r1 = n1.finish(timeout=30)
    finally:
        n0.signal(signal.SIGCONT)
    ended = time.monotonic() - t0
    r1.assert_rc(138)
    assert ended < NODE_TIMEOUT + 2 + 3, f"ended after {ended:.1f} s"
    assert re.search(rf"node 0 \([^)]+, 127\.0\.0\.1\) was lost: nothing heard from it for {NODE_TIMEOUT} s "
                     r"\(node_timeout\)", r1.err), r1.describe()
    r0 = n0.finish(timeout=30)
    r0.assert_rc(138)
    for run in (r0, r1):
        assert "sent garbage" not in run.err and "corrupted" not in run.err, run.describe()
    # Node 0, thawed, reads node 1's report that was waiting for it: named, not taken for a silence.
    assert re.search(r"node 1 \([^)]+\) stopped its ranks \(node 0 \([^)]+\) was lost: nothing heard", r0.err), \
        r0.describe()


# ---- an authenticated join (issue 18) ----------------------------------------------------------


def test_an_impostor_without_the_join_token_is_refused_and_the_real_node_still_joins(airhost):
    port = free_port()
    token = {"AIRHOST_JOIN_TOKEN": "s3cret-of-this-job"}
    n0 = airhost.start(script("show_env.py"), "-n", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr",
                       "127.0.0.1", "--master-port", str(port), *COMMON, "--", "AIRHOST_JOIN_TOKEN", env=token)
    wait_for(lambda: b"waiting on port" in n0.err_path.read_bytes(), 30, "node 0 to listen")
    # The impostor comes first, as in the issue: a well-formed hello for node 1, no token.
    impostor = subprocess.run([sys.executable, script("join_impostor.py"), str(port)], capture_output=True,
                              text=True, timeout=30)
    assert impostor.stdout.strip() == "answer kind 3", impostor  # refuse, not welcome (2)
    n1 = airhost.start(script("show_env.py"), "-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                       "127.0.0.1", "--master-port", str(port), *COMMON, "--", "AIRHOST_JOIN_TOKEN", env=token)
    r1, r0 = n1.finish(), n0.finish()
    r0.assert_rc(0)
    r1.assert_rc(0)
    refused = [line for line in host_lines(r0) if "refused a join" in line]
    assert refused == ["airhost: node 0 of 2: refused a join from 127.0.0.1 as node 1: it holds no join token "
                       "(a node started without one, or not one of this job's)"], r0.err
    assert any("joined (its join token checked)" in line for line in host_lines(r0)), r0.err
    assert "the join is open" not in r0.err
    # The secret stays with the hosts: not in their output, their host log, nor any rank's environment.
    for run in (r0, r1):
        assert "s3cret" not in run.err and "s3cret" not in run.out
        assert "s3cret" not in (run.run_dir / "logs" / "host.log").read_text()
        for lines in run.console().values():
            assert lines == [b"AIRHOST_JOIN_TOKEN=<unset>"], lines


def test_a_node_without_the_token_is_told_what_to_do_and_exits_2(airhost):
    port = free_port()
    n0 = airhost.start(script("show_env.py"), "-n", "1", "--nnodes", "2", "--node-rank", "0", "--master-addr",
                       "127.0.0.1", "--master-port", str(port), "--node-timeout", "3", "--join-timeout", "5",
                       env={"AIRHOST_JOIN_TOKEN": "tok"})
    wait_for(lambda: b"waiting on port" in n0.err_path.read_bytes(), 30, "node 0 to listen")
    r1 = node(airhost, 1, port, script("show_env.py"), n=1).finish()
    r1.assert_rc(2)
    assert "node 0 admits only nodes holding this job's join token; give this node the same AIRHOST_JOIN_TOKEN" \
        in r1.err, r1.err
    n0.finish().assert_rc(138)  # the real node 1 never came: the join timeout, as before


def test_a_join_token_file_readable_by_others_is_refused_before_anything_starts(airhost, tmp_path):
    token = tmp_path / "token"
    token.write_text("tok\n")
    token.chmod(0o644)
    run = airhost(script("show_env.py"), "-n", "1", "--nnodes", "2", "--node-rank", "0", "--master-port",
                  str(free_port()), "--join-token-file", str(token))
    run.assert_rc(2)
    assert f"the join token file {token} can be read by other users; chmod 600 it" in run.err, run.err


@pytest.mark.timeout(180)
def test_two_nodes_are_one_mlflow_run_that_every_rank_logs_into(airhost, tmp_path):
    """Node 0's host makes the MLflow run; its link sends the run to node 1, whose ranks bind
    it: one run holds the metrics of the ranks of both nodes (real MLflow, sqlite store)."""
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient()
    client.search_experiments()  # the store exists, as a user's does
    logger = airhost.work / "log.py"
    logger.write_text("import os, mlflow\nrank = int(os.environ['RANK'])\n"
                      "for step in range(10):\n    mlflow.log_metric(f'loss_{rank}', 1.0 / (step + 1), step=step)\n")
    env = {"AIRHOST_TRACKING": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "two-nodes"}
    port = free_port()
    started = [airhost.start(str(logger), "-n", "1", "--nnodes", "2", "--node-rank", str(k), "--master-addr",
                             "127.0.0.1", "--master-port", str(port), *COMMON, env=env) for k in (0, 1)]
    r1, r0 = started[1].finish(timeout=150), started[0].finish(timeout=150)
    r0.assert_rc(0)
    r1.assert_rc(0)
    [run] = client.search_runs([client.get_experiment_by_name("two-nodes").experiment_id])
    assert run.info.status == "FINISHED"
    for rank in range(2):
        assert len(client.get_metric_history(run.info.run_id, f"loss_{rank}")) == 10, rank
    assert f"MLFLOW_RUN_ID={run.info.run_id}\n" in (r1.run_dir / "tracking.env").read_text()
    assert "MLflow" not in r1.err  # node 1 made no run of its own


# ---- every host out within moments, whatever --grace says (issue 41) ---------------------------

FOLLOW_NODES = 4
FOLLOW_BOUND = 5.0  # seconds from the event to the last host's exit; --grace is 12 times that


@pytest.mark.parametrize("event, node_hit, rc_hit", [
    ("rank fails", FOLLOW_NODES - 1, 1),
    ("SIGTERM", 1, 143),
    ("SIGINT", 0, 130),
    ("SIGKILL", 2, -signal.SIGKILL),
])
def test_every_host_ends_within_moments_of_a_failure_whatever_the_grace(airhost, tmp_path, event, node_hit, rc_hit):
    """A node that only follows another's end waits for the node it follows, never for a grace
    period: with --grace 60 every host is out within a few seconds, each with the contract's
    exit code (a wait for the grace, or a wait of two nodes for each other, would show here)."""
    d = tmp_path / "stamps"
    d.mkdir()
    hosts = start_light_nodes(airhost, FOLLOW_NODES, d, "--join-timeout", "60", "--node-timeout", "30", "--grace", "60")
    ended = {}
    try:
        wait_for(lambda: all((d / f"up-{r}").exists() for r in range(FOLLOW_NODES)), 60, "every rank running")
        t0 = time.monotonic()
        if event == "rank fails":
            (d / "fail").touch()
        else:
            hosts[node_hit].signal(getattr(signal, event))
        deadline = t0 + 30
        while len(ended) < FOLLOW_NODES and time.monotonic() < deadline:
            for k, h in enumerate(hosts):
                if k not in ended and h.proc.poll() is not None:
                    ended[k] = time.monotonic() - t0
            time.sleep(0.01)
        runs = [h.finish(timeout=5, check_processes=(k != node_hit or event != "SIGKILL"))
                for k, h in enumerate(hosts)]
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.proc.kill()
    for k, run in enumerate(runs):
        run.assert_rc(rc_hit if k == node_hit else 138)
    slowest = max(ended.values())
    assert slowest < FOLLOW_BOUND, f"after {event} on node {node_hit} the hosts ended at " + \
        ", ".join(f"node {k}: {s:.2f} s" for k, s in sorted(ended.items())) + "\n" + \
        "\n".join(r.describe() for r in runs)
    # The failing node's record is whole: its own outcome, not cut short by the others' exits.
    if event == "rank fails":
        assert runs[node_hit].run_json["outcome"] == "failed"
        assert re.search(rf"rank {node_hit} exited with code 1", runs[0].run_json["message"])

"""Elastic jobs (issue 35), first slice: `--nnodes MIN:MAX`. Real airhosts on 127.0.0.1 with
real gloo ranks: node 0 (given --node-rank 0) starts the job once MIN nodes joined and no
other came for --join-settle, or at once when MAX did; the nodes that leave out --node-rank
are numbered by node 0 in the order they came, and every rank's RANK, WORLD_SIZE, GROUP_RANK
and GROUP_WORLD_SIZE follow the group that formed. Too few nodes is 138 after --join-timeout,
and nodes that disagree on the range are refused before anything starts."""
import re

import pytest

from conftest import free_port, script

pytestmark = pytest.mark.timeout(120)

WORLD_RE = re.compile(r"rank (\d+) local (\d) group (\d) world (\d+) local_world (\d) nodes (\d) port \d+ "
                      r"sum (\d+) dist_rank (\d+)")


def elastic_node(airhost, port, *extra, rank=None, nnodes="2:4", script_name="node_world.py", settle="2s"):
    ranked = ("--node-rank", str(rank)) if rank is not None else ()
    return airhost.start(script(script_name), "-n", "2", "--nnodes", nnodes, *ranked, "--master-addr", "127.0.0.1",
                         "--master-port", str(port), "--join-settle", settle, "--join-timeout", "60",
                         "--node-timeout", "5", "--grace", "2", *extra)


def worlds(run):
    out = {}
    for rank, lines in run.console().items():
        m = WORLD_RE.fullmatch(lines[0].decode())
        assert m, lines
        out[rank] = tuple(map(int, m.groups()))
    return out


def test_three_nodes_of_2_to_4_form_one_gloo_world_numbered_by_node_0(airhost):
    port = free_port()
    n0 = elastic_node(airhost, port, rank=0)
    others = [elastic_node(airhost, port) for _ in range(2)]  # no --node-rank: node 0 numbers them
    runs = [n0.finish(timeout=90)] + [h.finish(timeout=90) for h in others]
    for run in runs:
        run.assert_rc(0)
    seen = {}
    for run in runs:
        node = run.run_json["node_rank"]
        assert run.run_json["nnodes"] == 3, run.run_json
        for rank, (r, local, group, world, local_world, nodes, total, dist_rank) in worlds(run).items():
            assert (r, group, world, local_world, nodes, total, dist_rank) == (rank, node, 6, 2, 3, 21, rank)
            assert r == node * 2 + local
            seen[r] = node
    assert seen == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    assert sorted(run.run_json["node_rank"] for run in runs) == [0, 1, 2]
    assert re.search(r"node 0 of 2:4: 3 nodes joined \(--nnodes 2:4\): node 1 \(.*\) and node 2 \(.*\); starting the "
                     r"ranks", runs[0].err), runs[0].err
    for run in runs[1:]:
        assert re.search(r"a node of 2:4: connected to node 0", run.err), run.err
        assert re.search(r"node [12] of 3: all 3 nodes joined at node 0", run.err), run.err


def test_max_nodes_start_at_once_without_waiting_out_the_settle_time(airhost):
    # --join-settle 10m: were node 0 to wait for it with MAX there, the test's timeout would end it.
    port = free_port()
    n0 = elastic_node(airhost, port, rank=0, nnodes="2:3", settle="10m")
    others = [elastic_node(airhost, port, nnodes="2:3", settle="10m") for _ in range(2)]
    runs = [n0.finish(timeout=90)] + [h.finish(timeout=90) for h in others]
    for run in runs:
        run.assert_rc(0)
        assert run.run_json["nnodes"] == 3
    assert "3 nodes joined (--nnodes 2:3)" in runs[0].err, runs[0].err


def test_min_nodes_with_their_own_ranks_start_after_the_settle_time_renumbered_without_gaps(airhost):
    # Node ranks given as 0 and 3 of 2:4: the group is nodes 0 and 1 (node 3 becomes node 1).
    port = free_port()
    n0 = elastic_node(airhost, port, rank=0, settle="1s")
    n3 = elastic_node(airhost, port, rank=3, settle="1s")
    r0, r3 = n0.finish(timeout=90), n3.finish(timeout=90)
    r0.assert_rc(0)
    r3.assert_rc(0)
    assert r3.run_json["node_rank"] == 1 and r3.run_json["nnodes"] == 2
    assert sorted(worlds(r3)) == [2, 3]
    assert all(w[3] == 4 for w in worlds(r3).values())
    assert "2 nodes here, enough for --nnodes 2:4; starting once no other node comes for 1 s" in r0.err, r0.err


def test_fewer_than_min_nodes_end_138_after_the_join_timeout_naming_the_range(airhost):
    port = free_port()
    # Node 1 would wait longer: node 0's deadline comes first, and its word reaches node 1.
    n0 = airhost.start(script("hello.py"), "-n", "1", "--nnodes", "3:4", "--node-rank", "0", "--master-addr",
                       "127.0.0.1", "--master-port", str(port), "--join-timeout", "3")
    n1 = airhost.start(script("hello.py"), "-n", "1", "--nnodes", "3:4", "--master-addr", "127.0.0.1",
                       "--master-port", str(port), "--join-timeout", "30")
    r0, r1 = n0.finish(timeout=60), n1.finish(timeout=60)
    r0.assert_rc(138)
    r1.assert_rc(138)
    said = (r"only 2 node\(s\) joined node 0 \(.*, port \d+\) within 3 s \(join_timeout\), and the job needs at least 3 "
            r"\(--nnodes 3:4\)")
    assert re.search(said, r0.err), r0.err
    assert re.search(said, r1.err), r1.err
    assert not list(r0.run_dir.glob("logs/rank-*")), "no rank was started"


def test_nodes_that_disagree_on_the_range_are_refused_with_one_message(airhost):
    port = free_port()
    n0 = airhost.start(script("hello.py"), "-n", "1", "--nnodes", "2:4", "--node-rank", "0", "--master-addr",
                       "127.0.0.1", "--master-port", str(port), "--join-timeout", "30")
    n1 = airhost.start(script("hello.py"), "-n", "1", "--nnodes", "2:3", "--master-addr", "127.0.0.1",
                       "--master-port", str(port), "--join-timeout", "30")
    r0, r1 = n0.finish(timeout=60), n1.finish(timeout=60)
    r0.assert_rc(2)
    r1.assert_rc(2)
    said = (r"the nodes disagree on the number of nodes: node 0 \(.*\) was given --nnodes 2:4, the node on .* "
            r"--nnodes 2:3; give every node the same --nnodes")
    assert re.search(said, r0.err), r0.err
    assert re.search(said, r1.err), r1.err


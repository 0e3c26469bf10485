"""Many nodes on this machine (issue 34): 48 airhosts on 127.0.0.1, one light rank each, form
one world; `airhost stacks` on node 0 answers for every rank; the last node's rank fails and
every host ends by the contract, naming it, with no process left. Nothing here is timed (the
curve is bench/scale.py's); what is tested is that the join, the reports and the stacks work
past two nodes. (The link itself at 40 nodes, and node 0's loop under many heartbeats:
tests/cpp/test_node_link.cpp.)"""
import json
import re
import subprocess

import pytest

from conftest import start_light_nodes, wait_for

pytestmark = pytest.mark.timeout(240)

NODES = 48


def test_48_nodes_join_answer_stacks_and_all_end_naming_the_rank_that_failed(airhost, tmp_path):
    d = tmp_path / "stamps"
    d.mkdir()
    hosts = start_light_nodes(airhost, NODES, d, "--join-timeout", "120", "--node-timeout", "30", "--grace", "3")
    try:
        wait_for(lambda: all((d / f"up-{r}").exists() for r in range(NODES)), 120, f"all {NODES} ranks running")
        # Each rank is on the node of its rank (one rank a node), as GROUP_RANK says.
        assert all((d / f"up-{r}").read_text() == str(r) for r in range(NODES))

        env = airhost.env(hosts[0].runs_root)
        run_id = hosts[0].run_dir().name

        def all_waiting():
            done = subprocess.run([airhost.binary, "stacks", run_id, "--json"], env=env, capture_output=True,
                                  text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert done.returncode == 0, done.stderr
            ranks = json.loads(done.stdout)["ranks"]
            assert [r["rank"] for r in ranks] == list(range(NODES)), [r["rank"] for r in ranks]
            assert [r["node"] for r in ranks] == list(range(NODES))
            # A rank of a loaded machine may be between two lines of wait_here: asked again.
            return all(r["status"] == "answered" and "in wait_here" in r["where"] for r in ranks) or None
        wait_for(all_waiting, 60, f"stacks of all {NODES} ranks, every one in wait_here")

        (d / "fail").touch()
        runs = [h.finish(timeout=120) for h in hosts]
    finally:
        for h in hosts:
            if h.proc.poll() is None:
                h.proc.kill()
    last = NODES - 1
    runs[last].assert_rc(1)
    for k, run in enumerate(runs[:last]):
        run.assert_rc(138)
        assert re.search(rf"node {last} \(.*\) failed: rank {last} exited with code 1", run.err), \
            f"node {k}:\n{run.describe()}"
    assert re.search(rf"rank {last} exited with code 1", runs[last].err), runs[last].describe()
    # Node 0's record names the root cause.
    assert re.search(rf"rank {last} exited with code 1", runs[0].run_json["message"]), runs[0].run_json["message"]

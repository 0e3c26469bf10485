"""Two airhost "nodes" on this machine, each in its own network namespace, joined by a veth
pair (10.x.y.1 and 10.x.y.2): they train examples/mlp_ddp.py as one 2 x 2 gloo world; then
one node is cut off (its link goes down: no FIN, only silence) or killed, and the other
must end within node_timeout (plus the grace), with no process left in either namespace.

Needs root and iproute2 (scripts/setup.sh installs it with the test dependencies)."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import REPO, Started, script

pytestmark = pytest.mark.timeout(120)

NODE_TIMEOUT = 3
GRACE = 2
PORT = 29400 + os.getpid() % 500  # each namespace has ports of its own; node 0's host only


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Namespaces:
    def __init__(self, tag):
        self.ns = [f"airhost-t{tag}-0", f"airhost-t{tag}-1"]
        self.veth = [f"ahv{tag}x0", f"ahv{tag}x1"]  # interface names: 15 characters at most
        net = f"10.{200 + tag % 50}.{tag % 250}"
        self.addr = [f"{net}.1", f"{net}.2"]

    def create(self):
        for ns in self.ns:
            ip("netns", "add", ns)
        ip("link", "add", self.veth[0], "netns", self.ns[0], "type", "veth", "peer", "name", self.veth[1],
           "netns", self.ns[1])
        for ns, veth, addr in zip(self.ns, self.veth, self.addr):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            ip("-n", ns, "link", "set", veth, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def pids(self, i):
        out = ip("netns", "pids", self.ns[i], check=False).stdout
        return [int(p) for p in out.split()]

    def destroy(self):
        for i, ns in enumerate(self.ns):
            for pid in self.pids(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", ns, check=False)  # takes its end of the veth pair with it


@pytest.fixture
def netns():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 is not installed (apt-get install iproute2, or scripts/setup.sh with "
                    "AIRHOST_SETUP_TEST_DEPS=1)")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    spaces = Namespaces(os.getpid() % 10000)
    try:
        spaces.create()
    except subprocess.CalledProcessError as e:
        spaces.destroy()
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    yield spaces
    spaces.destroy()


class _InNamespace:
    """What conftest.Started needs of its launcher, running airhost under `ip netns exec`
    (which execs in place: the process started is airhost itself)."""

    def __init__(self, airhost):
        self.binary = "ip"
        self._airhost = airhost

    def _collect(self, *args):
        return self._airhost._collect(*args)


def start_node(airhost, spaces, i, target, *args, script_args=(), extra_env=None):
    runs_root = airhost._new_runs_root()
    n = airhost.count
    argv = ["netns", "exec", spaces.ns[i], airhost.binary, target, "-n", "2", "--nnodes", "2", "--node-rank", str(i),
            "--master-addr", spaces.addr[0], "--master-port", str(PORT), "--node-timeout", str(NODE_TIMEOUT),
            "--grace", str(GRACE), *args]
    if script_args:
        argv += ["--", *script_args]
    env = airhost.env(runs_root, {"GLOO_SOCKET_IFNAME": spaces.veth[i], **(extra_env or {})})
    return Started(_InNamespace(airhost), argv, airhost.work, runs_root, env,
                   airhost.tmp_path / f"host-{n}.stdout", airhost.tmp_path / f"host-{n}.stderr")


def assert_namespaces_empty(spaces, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (spaces.pids(0) or spaces.pids(1)):
        time.sleep(0.05)
    assert not spaces.pids(0) and not spaces.pids(1), \
        f"left in {spaces.ns[0]}: {spaces.pids(0)}, in {spaces.ns[1]}: {spaces.pids(1)}"


def train_and_check(airhost, spaces):
    mlp = str(REPO / "examples" / "mlp_ddp.py")
    n0 = start_node(airhost, spaces, 0, mlp)
    n1 = start_node(airhost, spaces, 1, mlp)
    r0, r1 = n0.finish(timeout=100), n1.finish(timeout=30)
    r0.assert_rc(0)
    r1.assert_rc(0)
    assert re.search(r"^\[rank 0\] epoch 5/5  loss \d", r0.out, re.M), r0.describe()
    assert re.search(r"^\[rank 0\] final loss 0\.0", r0.out, re.M), r0.describe()
    assert f"node 1 (" in r0.err and f", {spaces.addr[1]}) joined" in r0.err
    assert [r["rank"] for r in r1.ranks] == [2, 3]
    assert_namespaces_empty(spaces)


def start_loops(airhost, spaces):
    loop = script("collective_loop.py")
    n0 = start_node(airhost, spaces, 0, loop)
    n1 = start_node(airhost, spaces, 1, loop)
    n0.wait_printed([0, 1], "ready world=4", timeout=60)
    n1.wait_printed([2, 3], "ready world=4", timeout=60)
    return n0, n1


def test_two_namespaces_train_then_a_node_cut_off_ends_both(airhost, netns):
    train_and_check(airhost, netns)

    n0, n1 = start_loops(airhost, netns)
    t0 = time.monotonic()
    ip("-n", netns.ns[1], "link", "set", netns.veth[1], "down")  # no FIN, no RST: silence
    r0 = n0.finish(timeout=30)
    r1 = n1.finish(timeout=30)
    took = time.monotonic() - t0
    bound = NODE_TIMEOUT + GRACE + 3
    assert took < bound, f"both nodes must end within {bound} s of the cut, took {took:.1f} s"
    r0.assert_rc(138)
    r1.assert_rc(138)
    assert re.search(rf"node 1 \([^)]+, {re.escape(netns.addr[1])}\) was lost: nothing heard from it for "
                     rf"{NODE_TIMEOUT} s \(node_timeout\); this node's ranks were stopped", r0.err), r0.describe()
    assert re.search(rf"node 0 \([^)]+, {re.escape(netns.addr[0])}\) was lost: nothing heard from it for "
                     rf"{NODE_TIMEOUT} s \(node_timeout\); this node's ranks were stopped", r1.err), r1.describe()
    assert r0.run_json["outcome"] == r1.run_json["outcome"] == "node_lost"
    assert_namespaces_empty(netns)


def test_two_namespaces_a_killed_node_ends_the_other_at_once(airhost, netns):
    n0, n1 = start_loops(airhost, netns)
    t0 = time.monotonic()
    n1.signal(signal.SIGKILL)
    r0 = n0.finish(timeout=30)
    took = time.monotonic() - t0
    assert took < NODE_TIMEOUT, f"a killed node's connection closes: node 0 must not wait for silence ({took:.1f} s)"
    r0.assert_rc(138)
    assert re.search(rf"node 1 \([^)]+, {re.escape(netns.addr[1])}\) was lost: its connection closed", r0.err), \
        r0.describe()
    r1 = n1.finish(timeout=10, check_processes=False)
    assert r1.rc == -signal.SIGKILL
    assert_namespaces_empty(netns)


def test_two_namespaces_a_killed_node_comes_back_past_an_impostor_and_the_job_goes_on(airhost, netns):
    # Issue 18: node 1's airhost SIGKILLed mid-run; while node 0 waits for it on the port again,
    # an impostor in node 1's namespace sends a hello without the job's token and is refused;
    # then node 1's airhost is started again, joins with the token, and both nodes finish.
    flaky = str(REPO / "tests" / "py" / "restart_scripts" / "flaky.py")
    token = {"AIRHOST_JOIN_TOKEN": "token-of-this-job"}
    args = ("--max-restarts", "1", "--join-timeout", "60")
    sargs = ("--fail-until", "0", "--then-sleep", "3", "--then-sleep-once", "60")
    n0 = start_node(airhost, netns, 0, flaky, *args, script_args=sargs, extra_env=token)
    n1 = start_node(airhost, netns, 1, flaky, *args, script_args=sargs, extra_env=token)
    deadline = time.monotonic() + 60
    while not all(n.out_path.read_bytes().count(b"attempt 0 of max") == 2 for n in (n0, n1)):
        assert time.monotonic() < deadline, "every rank to start"
        time.sleep(0.1)
    n1.signal(signal.SIGKILL)
    n1.finish(timeout=30, check_processes=False)
    while b"to come back" not in n0.err_path.read_bytes():
        assert time.monotonic() < deadline + 30, n0.err_path.read_bytes()
        time.sleep(0.1)
    impostor = subprocess.run(["ip", "netns", "exec", netns.ns[1], "python3", script("join_impostor.py"), str(PORT),
                               netns.addr[0]], capture_output=True, text=True, timeout=30)
    assert impostor.stdout.strip() == "answer kind 3", impostor  # refused
    back = start_node(airhost, netns, 1, flaky, *args, script_args=sargs, extra_env=token)
    r0, rb = n0.finish(timeout=60), back.finish(timeout=60)
    r0.assert_rc(0)
    rb.assert_rc(0)
    assert f"refused a join from {netns.addr[1]} as node 1: it holds no join token" in r0.err, r0.err
    assert re.search(rf"node 1 \([^)]+, {re.escape(netns.addr[1])}\) came back \(its join token checked\)", r0.err), r0.err
    assert "came back to the job" in rb.err, rb.err
    assert r0.run_json["restarts"] == rb.run_json["restarts"] == 1
    assert_namespaces_empty(netns)

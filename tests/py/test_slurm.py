"""airhost under a real Slurm (Debian's slurm-wlm and munge), started by these tests on this
machine: munged, slurmctld and slurmd with a generated slurm.conf in a temporary directory,
all stopped at the end with nothing left running.

Where network namespaces can be made (root, iproute2), the cluster has two nodes, n1 and n2,
each a slurmd in its own network namespace (its own address on a bridge, its own loopback),
UTS namespace (its own host name) and /etc/hosts (a bind mount inside its own mount
namespace: the machine's file is not touched), so that `srun -N2` starts one airhost per
"node" and the ranks of both rendezvous over the bridge as on two machines. They share the
file system and CPUs, which a real pair of nodes would not: the per-node /tmp/airhost-ports
(where airhost locks the ports it reserves) is therefore a per-node bind mount too. Without
namespaces (or with AIRHOST_TEST_SLURM_ONE_NODE=1) the cluster is one node, localhost, and
the two-node tests are skipped, saying why.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN, free_port, marker_of, script

DAEMONS = ["munged", "slurmctld", "slurmd", "srun", "sinfo", "salloc", "scancel"]
MISSING = [d for d in DAEMONS if not shutil.which(d, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]

pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed ({', '.join(MISSING)} missing): "
                       "apt-get install slurm-wlm munge, or scripts/setup.sh with AIRHOST_SETUP_TEST_DEPS=1"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test's slurmd runs jobs as root (SlurmUser=root)"),
    pytest.mark.timeout(120),
]


def which(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


class Network:
    """A bridge in this namespace and one network namespace per node, joined to it by veth."""

    def __init__(self, tag: str, nodes: list[str]):
        self.tag, self.nodes, self.made = tag, nodes, []
        self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.bridge = f"ahb{tag}"
        self.addr = {n: f"{self.subnet}.{11 + i}" for i, n in enumerate(nodes)}
        self.ctl_addr = f"{self.subnet}.1"

    def netns(self, node: str) -> str:
        return f"airhost-{self.tag}-{node}"

    def sh(self, *argv):
        r = run(list(argv))
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")

    def up(self) -> None:
        ip = which("ip")
        self.sh(ip, "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        self.sh(ip, "addr", "add", f"{self.ctl_addr}/24", "dev", self.bridge)
        self.sh(ip, "link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            ns, outer, inner = self.netns(node), f"ah{self.tag}h{i}", f"ah{self.tag}c{i}"
            self.sh(ip, "netns", "add", ns)
            self.made.append(("netns", ns))
            self.sh(ip, "link", "add", outer, "type", "veth", "peer", "name", inner)
            self.made.append(("link", outer))
            self.sh(ip, "link", "set", outer, "master", self.bridge)
            self.sh(ip, "link", "set", outer, "up")
            self.sh(ip, "link", "set", inner, "netns", ns)
            self.sh(ip, "-n", ns, "addr", "add", f"{self.addr[node]}/24", "dev", inner)
            self.sh(ip, "-n", ns, "link", "set", inner, "up")
            self.sh(ip, "-n", ns, "link", "set", "lo", "up")

    def down(self) -> None:
        ip = which("ip")
        for kind, name in reversed(self.made):
            if kind == "netns":
                run([ip, "netns", "del", name])
            else:
                run([ip, "link", "del", name])
        self.made.clear()


class Cluster:
    def __init__(self, root: Path, network: Network | None):
        self.root, self.network = root, network
        self.nodes = network.nodes if network else ["localhost"]
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
        for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES"):
            self.env.pop(name, None)

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def write_config(self) -> None:
        r = self.root
        for d in ("munge", "munge-key", "state", "spool", "log"):
            (r / d).mkdir()
        (r / "munge-key").chmod(0o700)
        key = r / "munge-key" / "key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ctl = f"localhost({self.network.ctl_addr})" if self.network else "localhost"
        if self.network:
            nodes = "\n".join(f"NodeName={n} NodeAddr={self.network.addr[n]} CPUs=2 State=UNKNOWN" for n in self.nodes)
        else:
            nodes = "NodeName=localhost CPUs=2 State=UNKNOWN"
        self.conf.write_text(f"""\
ClusterName=airhosttest
SlurmctldHost={ctl}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge/socket,cred_expire=10
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
PlugStackConfig=/dev/null
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdTimeout=30
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
""")

    def start(self) -> None:
        self.write_config()
        r = self.root
        self.spawn("munged", [which("munged"), "-F", "-f", f"--socket={r}/munge/socket",
                              f"--key-file={r}/munge-key/key", f"--log-file={r}/log/munged.log",
                              f"--pid-file={r}/munge-key/pid", f"--seed-file={r}/munge-key/seed"])
        self.wait(lambda: (r / "munge" / "socket").exists(), 10, "munged's socket", "munged.log")
        self.spawn("slurmctld", [which("slurmctld"), "-D", "-c", "-f", str(self.conf)])
        for node in self.nodes:
            if not self.network:
                self.spawn(f"slurmd-{node}", [which("slurmd"), "-D", "-f", str(self.conf)])
                continue
            # A node: its own network, host name and /etc/hosts (and airhost's port locks).
            hosts = r / f"hosts-{node}"
            hosts.write_text("127.0.0.1 localhost\n" + f"{self.network.ctl_addr} controller\n" +
                             "".join(f"{a} {n}\n" for n, a in self.network.addr.items()))
            ports = r / f"ports-{node}"
            ports.mkdir()
            Path("/tmp/airhost-ports").mkdir(mode=0o1777, exist_ok=True)
            inner = (f"hostname {node} && mount --bind {hosts} /etc/hosts && "
                     f"mount --bind {ports} /tmp/airhost-ports && exec {which('slurmd')} -D -N {node} -f {self.conf}")
            self.spawn(f"slurmd-{node}", [which("nsenter"), f"--net=/run/netns/{self.network.netns(node)}",
                                          which("unshare"), "--mount", "--uts", "sh", "-c", inner])

        def idle():
            out = run(["sinfo", "-h", "-o", "%n %t"], env=self.env).stdout.split()
            states = dict(zip(out[::2], out[1::2]))
            return all(states.get(n) == "idle" for n in self.nodes)
        self.wait(idle, 45, "every node idle in sinfo", "slurmctld.log")

    def spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=self.env))
        out.close()

    def wait(self, ready, timeout: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                                 for p in sorted((self.root / "log").iterdir()))
                raise RuntimeError(f"Slurm did not come up ({what}): {dead and 'a daemon exited' or 'timeout'}\n{logs}")
            time.sleep(0.2)

    def stop(self) -> list[str]:
        """Stops every daemon (slurmd first); returns what is still running afterwards."""
        run(["scancel", "--full", "-u", "root"], env=self.env)
        for p in reversed(self.procs):  # slurmds, then slurmctld, then munged
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return self.leftovers()

    def leftovers(self) -> list[str]:
        """Processes whose environment names this cluster's slurm.conf (daemons, steps, tasks)."""
        want = f"SLURM_CONF={self.conf}".encode()
        left = []
        deadline = time.monotonic() + 10
        while True:
            left = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                if int(pid) != os.getpid() and want in environ.split(b"\0") and stat.split(")")[-1].split()[0] != "Z":
                    left.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ').decode()}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def make_network() -> tuple[Network | None, str]:
    if os.environ.get("AIRHOST_TEST_SLURM_ONE_NODE") == "1":
        return None, "AIRHOST_TEST_SLURM_ONE_NODE=1"
    missing = [t for t in ("ip", "nsenter", "unshare") if not which(t)]
    if missing:
        return None, f"{', '.join(missing)} missing"
    net = Network(f"{os.getpid() % 100000}", ["n1", "n2"])
    routes = run([which("ip"), "-4", "route"]).stdout
    if f"{net.subnet}." in routes or f"{net.subnet}.0/" in routes:
        return None, f"{net.subnet}.0/24 is already routed here"
    try:
        net.up()
    except RuntimeError as e:
        net.down()
        return None, f"cannot make network namespaces here: {e}"
    return net, ""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    network, why = make_network()
    cluster = Cluster(tmp_path_factory.mktemp("slurm"), network)
    cluster.why_one_node = why
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
        if network:
            network.down()
    assert not left, "Slurm processes outlived the tests:\n" + "\n".join(left)


def srun(cluster: Cluster, airhost, *argv, timeout=90) -> subprocess.CompletedProcess:
    """`srun ARGV` from the test's work directory, with the environment a launch of the test
    suite gets (runs directory, no MLflow) and the cluster's SLURM_CONF."""
    env = {**airhost.env(airhost.tmp_path / "runs"), "SLURM_CONF": cluster.env["SLURM_CONF"],
           "PATH": cluster.env["PATH"]}
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES"):
        env.pop(name, None)
    return run([which(argv[0]), *argv[1:]], env=env, cwd=airhost.work, timeout=timeout)


def test_srun_one_node_airhost_takes_its_topology_from_slurm(slurm, airhost):
    first = slurm.nodes[0]
    r = srun(slurm, airhost, "srun", "-N1", f"-w{first}", "--ntasks-per-node=1", "airhost", "--print-env", "-n", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("cluster: slurm (SLURM_JOB_ID="), r.stdout
    assert any(l.split()[:2] == ["nnodes", "1"] and l.endswith("slurm: SLURM_STEP_NUM_NODES=1") for l in lines), r.stdout
    assert any(l.split()[:2] == ["node_rank", "0"] and l.endswith("slurm: SLURM_NODEID=0") for l in lines), r.stdout
    assert "note: one node: the rendezvous stays on this node" in r.stdout

    r = srun(slurm, airhost, "srun", "-N1", f"-w{first}", "--ntasks-per-node=1", "airhost",
             script("show_env.py"), "--accelerators", "2", "--",
             "RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "SLURM_NODEID")
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        for line in (f"RANK={rank}", "WORLD_SIZE=2", "GROUP_RANK=0", "GROUP_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                     "SLURM_NODEID=0"):
            assert f"[rank {rank}] {line}\n" in r.stdout, r.stdout + r.stderr


def test_srun_with_two_tasks_per_node_is_refused_saying_to_use_one(slurm, airhost):
    r = srun(slurm, airhost, "srun", "-N1", f"-w{slurm.nodes[0]}", "--ntasks-per-node=2", "airhost",
             script("hello.py"))
    assert r.returncode == 2, r.stdout + r.stderr
    # Both tasks refuse, before starting any rank.
    assert r.stderr.count("airhost: this Slurm step runs 2 tasks on a node (SLURM_STEP_TASKS_PER_NODE=2); airhost "
                          "starts every rank of its node itself, so Slurm must run exactly one airhost per node: "
                          "srun --ntasks-per-node=1 airhost train.py") == 2, r.stderr
    assert "[rank" not in r.stdout


def test_two_slurm_nodes_make_one_world(slurm, airhost):
    if len(slurm.nodes) < 2:
        pytest.skip(f"one Slurm node only: {slurm.why_one_node}")
    r = srun(slurm, airhost, "srun", "-N2", "--ntasks-per-node=1", "--label", "airhost", "--print-env", "-n", "2")
    assert r.returncode == 0, r.stderr
    by_task = {t: [l[len(f"{t}: "):] for l in r.stdout.splitlines() if l.startswith(f"{t}: ")] for t in (0, 1)}
    for node_rank, lines in by_task.items():
        text = "\n".join(lines)
        assert f"node_rank     {node_rank}" in text and "slurm: SLURM_NODEID" in text, text
        assert "master_addr   n1" in text and "slurm: first host of SLURM_STEP_NODELIST=n[1-2]" in text, text
        assert "slurm: 20000 + SLURM_JOB_ID % 10000" in text, text

    # A real world of 2 nodes x 2 ranks over the bridge: gloo all-reduce of rank+1 = 10.
    r = srun(slurm, airhost, "srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "airhost",
             script("allreduce.py"), "-n", "2", timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(4):
        assert re.search(rf"^\[rank {rank}\] rank {rank} MASTER_PORT=2\d{{4}} sum=10$", r.stdout, re.M), r.stdout + r.stderr

    # The allocation's shell, outside srun, is refused: the other node would never join.
    r = srun(slurm, airhost, "salloc", "-N2", "airhost", "--print-env")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "airhost is running in a 2-node Slurm allocation but outside srun" in r.stderr


def test_an_elastic_job_under_slurm_takes_its_node_ranks_and_master_from_slurm(slurm, airhost):
    """#35: srun --nodes 2-4 of an airhost given --nnodes 2:4 on a cluster of 2: the step's node
    count is MAX, so node 0 (SLURM_NODEID 0, the first host of the step) starts the job as soon as
    both nodes joined, the ranks' store on a port of its own (node 0 keeps Slurm's for nodes that
    come back)."""
    if len(slurm.nodes) < 2:
        pytest.skip(f"one Slurm node only: {slurm.why_one_node}")
    # --join-settle 60s: with the step's 2 nodes as MAX, node 0 starts as soon as both joined.
    r = srun(slurm, airhost, "srun", "--nodes=2-4", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "airhost",
             script("allreduce.py"), "-n", "2", "--nnodes", "2:4", "--join-settle", "60s", timeout=50)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(4):
        assert re.search(rf"^\[rank {rank}\] rank {rank} MASTER_PORT=\d+ sum=10$", r.stdout, re.M), r.stdout + r.stderr
    assert re.search(r"node 0 of 2:2: 2 nodes joined \(--nnodes 2:2\): node 1 \(n2, [0-9.]+\); starting the ranks",
                     r.stderr), r.stderr

    # A step with fewer nodes than MIN can never start: refused at once, naming what to ask for.
    r = srun(slurm, airhost, "srun", "-N2", "--ntasks-per-node=1", "airhost", script("allreduce.py"), "--nnodes", "3:4",
             timeout=50)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--nnodes 3:4 needs at least 3 nodes, but this Slurm step has 2 (SLURM_STEP_NUM_NODES=2): ask srun for them " \
           "(srun --nodes 3-4)" in r.stderr, r.stderr


def test_deploy_slurm_train_sbatch_runs_as_written_but_for_its_gpus(slurm, airhost):
    """deploy/slurm/train.sbatch itself, with the GPUs and CPUs this machine lacks overridden
    on sbatch's command line (which wins over #SBATCH lines)."""
    if len(slurm.nodes) < 2:
        pytest.skip(f"one Slurm node only: {slurm.why_one_node}")
    (airhost.work / "train.py").write_text(
        "import os, sys\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print(f'rank {dist.get_rank()} of {dist.get_world_size()} node {os.environ[\"GROUP_RANK\"]} "
        "args {sys.argv[1:]}', flush=True)\n"
        "dist.destroy_process_group()\n")
    sbatch = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "train.sbatch"
    r = srun(slurm, airhost, "sbatch", "--wait", "--gpus-per-node=0", "--cpus-per-task=2", "--time=5",
             f"--output={airhost.work}/job.out", str(sbatch), timeout=100)
    out = (airhost.work / "job.out").read_text() if (airhost.work / "job.out").exists() else "(no output)"
    assert r.returncode == 0, r.stdout + r.stderr + out
    for rank in (0, 1):  # no GPU: one rank per node
        assert f"[rank {rank}] rank {rank} of 2 node {rank} args ['--epochs', '10']\n" in out, out

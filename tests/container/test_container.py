"""airhost as a container's entrypoint, run as users run it: deploy/Dockerfile built with a real
OCI runtime (podman) on a bare Debian made from Debian's packages (scripts/container-base.sh: no
image registry), from airhost's wheel (dist/) with no compiler in the image, and run with
`podman run`, `podman stop`, `podman kill` and a podman network between two containers.

    AIRHOST_TEST_DIST=dist .venv/bin/python -m pytest tests/container

scripts/test.sh runs it behind the suite once the wheels are built; it is skipped where podman
is not installed (`AIRHOST_SETUP_TEST_DEPS=1 scripts/setup.sh` installs it). The podman
settings are the project's (tests/container/containers.conf, through CONTAINERS_CONF), not the
machine's.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPTS = REPO / "tests" / "py" / "scripts"  # at /scripts in the containers
OWN_SCRIPTS = HERE / "scripts"  # at /container-scripts
DIST = Path(os.environ.get("AIRHOST_TEST_DIST") or REPO / "dist")
BASE = os.environ.get("AIRHOST_CONTAINER_BASE", "localhost/airhost-base:bookworm")
TAG = f"localhost/airhost-test:{os.getpid()}"
ENV = dict(os.environ, CONTAINERS_CONF=str(HERE / "containers.conf"))

pytestmark = [pytest.mark.skipif(not shutil.which("podman"), reason="podman is not installed "
                                 "(AIRHOST_SETUP_TEST_DEPS=1 scripts/setup.sh installs it)"),
              pytest.mark.timeout(600)]


def podman(*args: str, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="session")
def image():
    """deploy/Dockerfile's image on the Debian base (scripts/container-image.sh), built once."""
    t0 = time.monotonic()
    subprocess.run([str(REPO / "scripts" / "container-image.sh"), TAG], env=dict(ENV, AIRHOST_DIST=str(DIST)),
                   check=True, timeout=900)
    print(f"\ncontainer: base and image in {time.monotonic() - t0:.0f} s")
    yield TAG
    podman("rmi", "-f", TAG, check=False)


def container_args(runs: Path | None = None) -> list[str]:
    """What every `podman run` here adds before the image: the test scripts at /scripts and
    /container-scripts, no MLflow, /tmp as the working directory, and with `runs` a volume at
    /runs holding the run records."""
    args = ["-v", f"{SCRIPTS}:/scripts:ro", "-v", f"{OWN_SCRIPTS}:/container-scripts:ro",
            "-e", "AIRHOST_TRACKING=0", "-w", "/tmp"]
    if runs is not None:
        args += ["-v", f"{runs}:/runs", "-e", "AIRHOST_RUNS_DIR=/runs"]
    return args


def run(image: str, *args: str, timeout: float = 180):
    """`podman run --rm` of the image: (exit code, output)."""
    r = podman("run", "--rm", *container_args(), image, *args, timeout=timeout, check=False)
    return r.returncode, r.stdout + r.stderr


def test_the_image_has_no_compiler_and_airhost_is_its_entrypoint(image):
    found = podman("run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
                   "for c in cc gcc g++ c++ clang cmake; do command -v $c; done; airhost --version").stdout
    assert re.fullmatch(r"airhost \S+.*\n", found), found  # no compiler found, only the version line
    entry = json.loads(podman("image", "inspect", image, "--format", "{{json .Config.Entrypoint}}").stdout)
    assert entry == ["airhost"]


def test_airhost_is_pid_1_the_ranks_run_and_the_exit_code_is_the_contracts(image):
    rc, out = run(image, "/container-scripts/pid1.py", "-n", "2")
    assert rc == 0, out
    for r in (0, 1):
        assert f"[rank {r}] rank {r} of 2 parent 1 host_pid 1" in out, out
    rc, out = run(image, "/container-scripts/pid1.py", "-n", "2", "--", "0", "3")  # rank 1 exits 3
    assert rc == 3, out
    rc, out = run(image, "/scripts/sleeper.py", "-n", "2", "--timeout", "3", "--", "--sleep", "60")
    assert rc == 124, out


def wait_logged(name: str, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        logs = podman("logs", name, check=False)
        out = logs.stdout + logs.stderr
        if text in out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} never printed {text!r}:\n{out[-3000:]}")
        time.sleep(0.2)


def exit_code(name: str, timeout: float = 60) -> int:
    return int(podman("wait", name, timeout=timeout).stdout.strip().splitlines()[-1])


def test_podman_stop_ends_the_ranks_within_grace_143_recorded_and_no_zombie_inside(image, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    name = f"airhost-stop-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *container_args(runs), image, "/scripts/orphans.py", "-n", "2",
           "--grace", "3", "--", "--all", "--then-sleep")
    try:
        # Each rank left orphans that died: PID 1 (airhost) reaped every one, no zombie in the container.
        wait_logged(name, "no zombie", 90)
        wait_logged(name, "[rank 1] rank 1: no zombie", 30)
        t0 = time.monotonic()
        podman("stop", "-t", "30", name, timeout=60)
        stopped_in = time.monotonic() - t0
        assert exit_code(name) == 143
        out = podman("logs", name).stderr
    finally:
        podman("rm", "-f", name, check=False)
    assert stopped_in < 3 + 5, f"podman stop took {stopped_in:.1f} s (--grace 3)"
    record = json.loads(next(runs.glob("*/run.json")).read_text())
    assert record["state"] != "running" and record.get("exit_code") == 143, record
    assert "SIGTERM" in out or "terminated" in out.lower(), out


NET_SUBNET = "10.89.231.0/24"


@pytest.fixture
def network():
    name = f"airhost-test-{uuid.uuid4().hex[:8]}"
    podman("network", "create", "--subnet", NET_SUBNET, name)
    yield name
    podman("network", "rm", "-f", name, check=False)


def node(image, net, rank, ip, script, *args, runs: Path):
    name = f"airhost-n{rank}-{uuid.uuid4().hex[:6]}"
    podman("run", "-d", "--name", name, "--network", net, "--ip", ip, *container_args(runs), image,
           script, "-n", "2", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "10.89.231.10",
           "--master-port", "29500", "--node-timeout", "5", *args)
    return name


def test_two_containers_are_one_world_and_killing_one_ends_the_other_138(image, network, tmp_path):
    runs = [tmp_path / f"runs-{k}" for k in (0, 1)]
    for d in runs:
        d.mkdir()
    names = [node(image, network, k, f"10.89.231.{10 + k}", "/scripts/allreduce.py", runs=runs[k]) for k in (0, 1)]
    try:
        codes = [exit_code(n, 180) for n in names]
        outs = [podman("logs", n).stdout for n in names]
    finally:
        for n in names:
            podman("rm", "-f", n, check=False)
    assert codes == [0, 0], outs
    ranks = sorted(int(m) for out in outs for m in re.findall(r"^\[rank (\d+)\] rank \d+ MASTER_PORT=\d+ sum=10$", out, re.M))
    assert ranks == [0, 1, 2, 3], outs

    names = [node(image, network, k, f"10.89.231.{10 + k}", "/scripts/sleeper.py", "--", "--sleep", "120",
                  runs=runs[k]) for k in (0, 1)]
    try:
        for n in names:
            wait_logged(n, "ready", 120)
        t0 = time.monotonic()
        podman("kill", names[1])
        code = exit_code(names[0], 60)
        ended_in = time.monotonic() - t0
        logs = podman("logs", names[0]).stderr
    finally:
        for n in names:
            podman("rm", "-f", n, check=False)
    assert code == 138, logs
    assert ended_in < 5, f"node 0 took {ended_in:.1f} s to end after node 1 was killed"

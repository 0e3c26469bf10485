"""Nothing a run starts escapes it, and airhost is a sound container entrypoint (PID 1).

Each rank of scripts/escape.py starts three processes that leave its process group (a new
session with the run's environment, a fork-setsid-fork daemon whose parent is gone at once,
a new session with an empty environment) and the tests check every one of them is gone,
reaped, not a zombie, after a normal end, a failure, Ctrl-C and a SIGKILL of the host.
The PID 1 tests run airhost in a pid namespace of its own (`unshare --pid --fork
--mount-proc`), as `docker run` would.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Airhost, process_state, script, wait_for

ESCAPE = script("escape.py")
KINDS = ("session", "daemon", "bare")
PR_SET_CHILD_SUBREAPER = 36


def escaped(work: Path, ranks=(0, 1)) -> dict[str, int]:
    """The pids escape.py wrote down: {"rank-0.session": pid, ...}."""
    found = {}
    for r in ranks:
        for kind in KINDS:
            path = work / "escaped" / f"rank-{r}.{kind}"
            found[path.name] = int(path.read_text())
    return found


def stat_of(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) from /proc/PID/stat; None when the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1])


def all_stats() -> dict[int, tuple[str, int]]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat_of(int(name))) is not None:
            stats[int(name)] = st
    return stats


def children_of(parent: int) -> list[tuple[int, str]]:
    """(pid, state letter) of each process whose parent is `parent`."""
    return [(pid, state) for pid, (state, ppid) in all_stats().items() if ppid == parent]


def assert_gone(pids: dict[str, int], timeout: float = 5.0, reap: bool = False) -> None:
    """Every pid is gone from /proc within `timeout`: ended and reaped, not a zombie. `reap`:
    this process is the reaper (a SIGKILLed host's orphans come to the test's subreaper)."""
    deadline = time.monotonic() + timeout
    while True:
        if reap:
            for pid, state in children_of(os.getpid()):
                if state == "Z":
                    os.waitpid(pid, os.WNOHANG)
        left = {name: (pid, process_state(pid)) for name, pid in pids.items() if process_state(pid) is not None}
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still there {timeout} s later (pid, state): {left}")
        time.sleep(0.05)


# ---- nothing escapes ---------------------------------------------------------------------


def test_what_left_the_groups_is_gone_after_a_normal_end(airhost, work):
    run = airhost(ESCAPE, "-n", "2", "--", "exit")
    run.assert_rc(0)
    assert_gone(escaped(work), timeout=1.0)
    # Ended when the last rank did, not when the output drain gave up on the pipes they held.
    assert run.seconds < 15, run.describe()


def test_what_left_the_groups_is_gone_after_a_failure(airhost, work):
    run = airhost(ESCAPE, "-n", "2", "--", "raise")
    run.assert_rc(1)
    assert "RuntimeError: rank" in run.err
    assert_gone(escaped(work), timeout=1.0)


def test_what_left_the_groups_gets_ctrl_c_and_is_gone_after_it(airhost, work):
    host = airhost.start(ESCAPE, "-n", "2", "--grace", "5", "--", "sleep")
    host.wait_printed([0, 1], "ready")
    pids = escaped(work)
    host.signal(signal.SIGINT)
    run = host.finish()
    run.assert_rc(130)
    assert_gone(pids, timeout=1.0)
    # The session processes share the ranks' stdout: they were sent SIGINT too (Python's
    # KeyboardInterrupt), not merely killed at the end of the grace period.
    assert run.err.count("KeyboardInterrupt") >= 6, run.describe()
    assert run.seconds < 5 + 10, run.describe()


@pytest.fixture
def test_is_subreaper():
    """This process as child subreaper for the test: the orphans of a SIGKILLed host come to
    it, as they would to a container's init or to systemd, and the test reaps them. (This
    machine's PID 1 reaps nothing, so without it they would stay zombies under it.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_what_left_the_groups_is_gone_after_the_host_is_sigkilled(airhost, work, test_is_subreaper):
    host = airhost.start(ESCAPE, "-n", "2", "--", "sleep")
    host.wait_printed([0, 1], "ready")
    pids = escaped(work)
    # The "bare" processes cleared their environment: only the host's sweep (once a second)
    # names them to the guard, so it is given the time for one.
    time.sleep(1.5)
    host.signal(signal.SIGKILL)
    host.proc.wait(timeout=5)
    assert_gone(pids, timeout=5.0, reap=True)

    # The guard and the ranks too (children of this test's subreaper now): all end.
    def no_child_left():
        kids = children_of(os.getpid())
        for pid, state in kids:
            if state == "Z":
                os.waitpid(pid, os.WNOHANG)
        return not kids
    wait_for(no_child_left, 5.0, "the guard and the ranks to end")


def test_orphans_of_the_ranks_are_reaped_by_the_host(airhost):
    # Double-forked grandchildren that exit at once: the host adopts them (child subreaper)
    # and reaps them while the run goes on; none is left a zombie.
    run = airhost(script("orphans.py"), "-n", "2")
    run.assert_rc(0)
    assert run.console()[0] == [b"rank 0: no zombie"] and run.console()[1] == [b"rank 1: no zombie"], run.describe()


# ---- as PID 1 ------------------------------------------------------------------------------------

UNSHARE = shutil.which("unshare")


def pid_namespaces_work() -> bool:
    if not UNSHARE:
        return False
    return subprocess.run([UNSHARE, "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


pid1 = pytest.mark.skipif(not pid_namespaces_work(), reason="needs unshare --pid --fork --mount-proc (root, util-linux)")


class AsPid1(Airhost):
    """Runs airhost as PID 1 of a new pid namespace: `unshare --pid --fork --mount-proc airhost ...`."""

    def __init__(self, airhost: Airhost):
        super().__init__(UNSHARE, airhost.tmp_path)
        self.airhost_bin = airhost.binary
        self.count = 100  # run directories apart from the other launcher's

    def __call__(self, *args, **kw):
        return super().__call__("--pid", "--fork", "--mount-proc", self.airhost_bin, *args, **kw)

    def start(self, *args, **kw):
        return super().start("--pid", "--fork", "--mount-proc", self.airhost_bin, *args, **kw)


@pytest.fixture
def as_pid1(airhost) -> AsPid1:
    return AsPid1(airhost)


def host_of(started) -> int:
    """The pid (as this namespace sees it) of the airhost that is PID 1 inside: unshare's child."""
    def find():
        kids = children_of(started.pid)
        return kids[0][0] if kids else None
    return wait_for(find, 10, "unshare's child")


@pid1
def test_as_pid1_every_orphan_is_reaped(as_pid1):
    # --all: the ranks look at all of their pid namespace's /proc for a zombie.
    run = as_pid1(script("orphans.py"), "-n", "2", "--", "--all")
    run.assert_rc(0)
    assert run.console()[0] == [b"rank 0: no zombie"] and run.console()[1] == [b"rank 1: no zombie"], run.describe()


@pid1
def test_as_pid1_sigterm_is_forwarded_to_the_ranks_and_exits_143(as_pid1):
    host = as_pid1.start(script("orphans.py"), "-n", "2", "--", "--all", "--then-sleep")
    host.wait_printed([0, 1], "no zombie")
    pid = host_of(host)
    nspid = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].splitlines()[0].split()
    assert nspid[-1] == "1", nspid  # PID 1 inside
    os.kill(pid, signal.SIGTERM)  # from outside, as `docker stop` does
    run = host.finish(timeout=20)
    run.assert_rc(143)
    assert "was interrupted by SIGTERM" in run.err
    for r in run.ranks:  # the ranks got the SIGTERM (and died of it), not the grace's SIGKILL
        assert r["state"] == "stopped" and r["signal"] == signal.SIGTERM, r


@pid1
def test_as_pid1_the_exit_code_of_a_failing_rank_is_the_exit_code(as_pid1):
    run = as_pid1(script("fail.py"), "-n", "2", "--", "--rank", "1", "--how", "exit", "--code", "7")
    run.assert_rc(7)


@pid1
def test_as_pid1_a_bad_command_line_exits_2(as_pid1):
    run = as_pid1("--accelerators", "zero", "train.py")
    run.assert_rc(2)
    assert "airhost:" in run.err


def descendants(pid: int) -> list[int]:
    parents = {p: ppid for p, (_, ppid) in all_stats().items()}
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier}
        found += frontier
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@pid1
def test_as_pid1_a_signal_before_the_run_starts_is_not_lost(as_pid1):
    # --preflight has a child import torch before any rank starts. PID 1 gets no signal it
    # leaves at SIG_DFL, so without a handler this SIGTERM would be dropped and the run start.
    host = as_pid1.start("--preflight", script("sleeper.py"), "-n", "1")
    pid = host_of(host)
    wait_for(lambda: any("import torch" in cmdline(c) for c in descendants(pid)), 30, "the preflight's import torch")
    os.kill(pid, signal.SIGTERM)
    run = host.finish(timeout=20)
    run.assert_rc(143)
    assert "ready" not in run.out and run.run_dir is None, run.describe()

"""Fixtures of the end-to-end suite: run the installed `airhost` like a user would, then
look at everything it leaves behind (exit status, console, run.json, log files, /proc).

Every launch gets its own AIRHOST_RUNS_DIR under the test's tmp_path, so the run directory
is simply the one entry that appears there. Scripts run from tests/py/scripts record every
byte they print in <cwd>/printed/ (see scripts/emit.py), so a test can compare each rank's
log files with exactly what the rank printed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
REPO = HERE.parent.parent
VENV_BIN = os.path.dirname(sys.executable)

# /proc reading is shared with the Python API tests' helpers (stdlib only).
sys.path.insert(0, str(HERE / "api_scripts"))
from _helpers import _read, process_state  # noqa: E402

# A suite started in the background of a shell without job control (`cmd &` in a script, CI
# runners) inherits SIGINT and SIGQUIT ignored, and every caller, host and rank it starts would
# too: an ignored disposition survives exec. The tests that interrupt a caller then wait for a
# KeyboardInterrupt that never comes (found as "the caller still ran 30 s after SIGINT" under
# load). Give the processes of the tests the dispositions of a terminal's.
for _sig, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _handler)


def script(name: str) -> str:
    """Absolute path of a helper script in tests/py/scripts."""
    path = SCRIPTS / name
    assert path.is_file(), path
    return str(path)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's pick), for tests that must name one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_unix(path) -> socket.socket:
    """A stream socket connected to the AF_UNIX socket at `path`, however long the path (an
    address holds 107 bytes; a test's tmp_path under pytest-xdist is longer than a test's run
    directory once left room for): a long one is reached through its directory's descriptor."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(path)
    if len(path.encode()) < 100:
        s.connect(path)
        return s
    d = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        s.connect(f"/proc/self/fd/{d}/{os.path.basename(path)}")
    finally:
        os.close(d)
    return s


def start_light_nodes(airhost, nnodes: int, stamps, *flags) -> list:
    """`nnodes` airhosts on 127.0.0.1, one light rank each (scripts/many_nodes.py: no torch; it
    stamps that it is up in `stamps`, and the last rank exits 1 once `stamps`/fail appears),
    node ranks 0 to nnodes - 1, with `flags` for every host."""
    port = free_port()
    return [airhost.start(script("many_nodes.py"), "-n", "1", "--nnodes", str(nnodes), "--node-rank", str(k),
                          "--master-addr", "127.0.0.1", "--master-port", str(port), *flags, "--", stamps)
            for k in range(nnodes)]


def line_of(path: str, marker: str) -> int:
    """1-based number of the first line of `path` containing `marker`."""
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if marker in text:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


# ---- processes ---------------------------------------------------------------------------


@dataclasses.dataclass
class Proc:
    pid: int
    state: str
    cmdline: list[str]

    def __str__(self) -> str:
        return f"pid {self.pid} [{self.state}] {' '.join(self.cmdline)[:200]}"


def is_running(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (state Z) or dead (X)."""
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def live_processes(run_id: str | None = None, marker: str | None = None) -> list[Proc]:
    """Running processes of a run: those whose environment holds AIRHOST_RUN_ID=<run_id>, or
    whose environment or command line contains `marker` (a test's unique tmp path).

    Zombies are ignored: in this container PID 1 does not always reap orphans, so a rank
    whose host was SIGKILLed may linger as a zombie, which is not a running process."""
    assert run_id or marker
    want_env = f"AIRHOST_RUN_ID={run_id}".encode() if run_id else None
    want_marker = marker.encode() if marker else None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == os.getpid():
            continue
        state = process_state(pid)
        if state is None or state in ("Z", "X"):
            continue
        environ = _read(f"/proc/{pid}/environ") or b""
        cmdline = _read(f"/proc/{pid}/cmdline") or b""
        match = want_env is not None and want_env in environ.split(b"\0")
        if want_marker is not None and (want_marker in environ or want_marker in cmdline):
            match = True
        if match and is_running(pid):  # a process may die while we look at it
            argv = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
            found.append(Proc(pid, state, argv))
    return found


def wait_until_gone(run_id: str | None = None, marker: str | None = None, timeout: float = 5.0) -> list[Proc]:
    """Polls until no process of the run is running; returns what is left after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = live_processes(run_id=run_id, marker=marker)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Polls predicate until it is true; a file it reads that does not exist yet counts as false."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except FileNotFoundError:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ---- one launch ---------------------------------------------------------------------------

PREFIX_RE = re.compile(rb"^\[rank (\d+)\] ")


def split_lines(data: bytes) -> list[bytes]:
    """Lines of `data` split on b"\\n" only; a last line without newline still counts."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


@dataclasses.dataclass
class Run:
    argv: list[str]
    rc: int
    stdout: bytes
    stderr: bytes
    cwd: Path
    runs_root: Path
    run_dir: Path | None
    run_json: dict | None
    seconds: float
    pid: int

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    @property
    def run_id(self) -> str | None:
        return self.run_json["run_id"] if self.run_json else (self.run_dir.name if self.run_dir else None)

    @property
    def ranks(self) -> list[dict]:
        assert self.run_json is not None, f"no run.json\n{self.describe()}"
        return self.run_json["ranks"]

    def rank(self, n: int) -> dict:
        for r in self.ranks:
            if r["rank"] == n:
                return r
        raise AssertionError(f"rank {n} not in run.json")

    def log(self, rank: int, stream: str = "stdout") -> bytes:
        assert self.run_dir is not None, f"no run directory\n{self.describe()}"
        return (self.run_dir / "logs" / f"rank-{rank}.{stream}.log").read_bytes()

    def printed(self, rank: int, stream: str = "stdout") -> bytes:
        """What rank `rank` printed on `stream` through scripts/emit.py."""
        path = self.cwd / "printed" / f"rank-{rank}.{stream}"
        return path.read_bytes() if path.exists() else b""

    def console(self, stream: str = "stdout") -> dict[int, list[bytes]]:
        """The host's prefixed console lines, per rank, prefix removed."""
        data = self.stdout if stream == "stdout" else self.stderr
        lines: dict[int, list[bytes]] = {}
        for line in split_lines(data):
            m = PREFIX_RE.match(line)
            if m:
                lines.setdefault(int(m.group(1)), []).append(line[m.end():])
        return lines

    def describe(self) -> str:
        return (f"$ airhost {' '.join(self.argv)}\nexit {self.rc} after {self.seconds:.1f} s\n"
                f"--- stdout (last 3000 bytes)\n{self.out[-3000:]}\n"
                f"--- stderr (last 3000 bytes)\n{self.err[-3000:]}")

    # -- assertions shared by the tests

    def assert_rc(self, expected: int) -> None:
        assert self.rc == expected, f"expected exit {expected}\n{self.describe()}"

    def assert_logs_complete(self, exact_stderr: bool = True, ranks=None) -> None:
        """Every rank's log files hold exactly what the rank printed (stderr may also end
        with what Python itself wrote there, a traceback, when exact_stderr is False)."""
        for r in self.ranks:
            n = r["rank"]
            if ranks is not None and n not in ranks:
                continue
            assert r["stdout_log"] == str(self.run_dir / "logs" / f"rank-{n}.stdout.log")
            assert r["stderr_log"] == str(self.run_dir / "logs" / f"rank-{n}.stderr.log")
            assert self.log(n, "stdout") == self.printed(n, "stdout"), f"stdout log of rank {n}"
            if exact_stderr:
                assert self.log(n, "stderr") == self.printed(n, "stderr"), f"stderr log of rank {n}"
            else:
                assert self.log(n, "stderr").startswith(self.printed(n, "stderr")), f"stderr log of rank {n}"

    def assert_console_matches_logs(self, ranks=None) -> None:
        """The prefixed console lines of each rank are exactly the lines of its logs."""
        out, err = self.console("stdout"), self.console("stderr")
        for r in self.ranks:
            n = r["rank"]
            if ranks is not None and n not in ranks:
                continue
            assert out.get(n, []) == split_lines(self.log(n, "stdout")), f"console stdout of rank {n}"
            assert err.get(n, []) == split_lines(self.log(n, "stderr")), f"console stderr of rank {n}"

    def assert_no_process_left(self, timeout: float = 3.0) -> None:
        if self.run_id:
            left = wait_until_gone(run_id=self.run_id, timeout=timeout)
            assert not left, "processes of run %s still running:\n%s" % (self.run_id, "\n".join(map(str, left)))


class Started:
    """A host started in the background (for signals); finish() waits and returns its Run."""

    def __init__(self, launcher: "Airhost", argv, cwd: Path, runs_root: Path, env, out_path: Path, err_path: Path):
        self.launcher, self.argv, self.cwd, self.runs_root = launcher, argv, cwd, runs_root
        self.out_path, self.err_path = out_path, err_path
        self.t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.proc = subprocess.Popen([launcher.binary, *argv], cwd=cwd, env=env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid

    def run_dir(self, timeout: float = 10.0) -> Path:
        """The run directory, once the host has created it."""
        def find():
            entries = [p for p in self.runs_root.iterdir() if p.is_dir()] if self.runs_root.exists() else []
            return entries[0] if len(entries) == 1 else None
        return wait_for(find, timeout, "the run directory")

    def wait_printed(self, ranks, text: str, timeout: float = 60.0) -> None:
        """Waits until every rank in `ranks` has printed `text` (scripts/emit.py record)."""
        def ready():
            for n in ranks:
                p = self.cwd / "printed" / f"rank-{n}.stdout"
                if not p.exists() or text.encode() not in p.read_bytes():
                    return False
            return True
        wait_for(ready, timeout, f"ranks {list(ranks)} to print {text!r}")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def finish(self, timeout: float = 60.0, check_processes: bool = True) -> Run:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"airhost {' '.join(self.argv)} still running after {timeout} s")
        seconds = time.monotonic() - self.t0
        run = self.launcher._collect(self.argv, rc, self.out_path.read_bytes(), self.err_path.read_bytes(),
                                     self.cwd, self.runs_root, seconds, self.pid)
        if check_processes:
            run.assert_no_process_left()
        return run


class Airhost:
    """Calls the installed airhost binary; `airhost(*args)` runs it to completion."""

    def __init__(self, binary: str, tmp_path: Path):
        self.binary = binary
        self.tmp_path = tmp_path
        self.work = tmp_path / "work"
        self.work.mkdir(exist_ok=True)
        self.count = 0

    def env(self, runs_root: Path, extra: dict | None = None, unset=()) -> dict:
        env = dict(os.environ)
        env.pop("AIRHOST_RANK_BINARY", None)
        for name in unset:
            env.pop(name, None)
        env["AIRHOST_RUNS_DIR"] = str(runs_root)
        # The test's own state dir: its warm server (test_warm.py) is found by its launches
        # and by no other test's.
        env["AIRHOST_STATE_DIR"] = str(self.tmp_path)
        env["AIRHOST_TEST_MARK"] = marker_of(self.tmp_path)
        # mlflow is installed in the test venv: no MLflow run per launch unless a test asks
        # for one (tests/py/test_cli_tracking.py does).
        env["AIRHOST_TRACKING"] = "0"
        env.update(extra or {})
        return env

    def _new_runs_root(self) -> Path:
        root = self.tmp_path / f"runs-{self.count}"
        self.count += 1
        return root

    def _collect(self, argv, rc, stdout, stderr, cwd, runs_root, seconds, pid) -> Run:
        entries = sorted(p for p in runs_root.iterdir() if p.is_dir()) if runs_root.exists() else []
        assert len(entries) <= 1, f"one launch made several run directories: {entries}"
        run_dir = entries[0] if entries else None
        run_json = None
        if run_dir is not None and (run_dir / "run.json").exists():
            run_json = json.loads((run_dir / "run.json").read_text())
        return Run(list(argv), rc, stdout, stderr, Path(cwd), runs_root, run_dir, run_json, seconds, pid)

    def __call__(self, *args, cwd=None, env=None, unset_env=(), timeout: float = 120.0) -> Run:
        argv = [str(a) for a in args]
        cwd = Path(cwd or self.work)
        runs_root = self._new_runs_root()
        t0 = time.monotonic()
        proc = subprocess.Popen([self.binary, *argv], cwd=cwd, env=self.env(runs_root, env, unset_env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"airhost {' '.join(argv)} did not finish within {timeout} s")
        run = self._collect(argv, proc.returncode, stdout, stderr, cwd, runs_root, time.monotonic() - t0, proc.pid)
        run.assert_no_process_left()
        return run

    def timed(self, *args, env=None, unset_env=(), timeout: float = 120.0) -> tuple[Run, dict]:
        """Runs like __call__, also noting when each piece of the host's output could be read:
        returns the Run and {"stdout": [(seconds, bytes), ...], "stderr": [...]}, the seconds
        from the start, one entry per read of the pipe."""
        argv = [str(a) for a in args]
        runs_root = self._new_runs_root()
        t0 = time.monotonic()
        proc = subprocess.Popen([self.binary, *argv], cwd=self.work, env=self.env(runs_root, env, unset_env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        pieces = {"stdout": [], "stderr": []}

        def read(name, pipe):
            while data := os.read(pipe.fileno(), 1 << 16):
                pieces[name].append((time.monotonic() - t0, data))

        readers = [threading.Thread(target=read, args=(name, getattr(proc, name))) for name in pieces]
        for t in readers:
            t.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"airhost {' '.join(argv)} did not finish within {timeout} s")
        finally:
            for t in readers:
                t.join(timeout=10)
        stdout, stderr = (b"".join(data for _, data in pieces[name]) for name in ("stdout", "stderr"))
        run = self._collect(argv, proc.returncode, stdout, stderr, self.work, runs_root, time.monotonic() - t0, proc.pid)
        run.assert_no_process_left()
        return run, pieces

    def start(self, *args, cwd=None, env=None, unset_env=()) -> Started:
        argv = [str(a) for a in args]
        cwd = Path(cwd or self.work)
        runs_root = self._new_runs_root()
        n = self.count
        return Started(self, argv, cwd, runs_root, self.env(runs_root, env, unset_env),
                       self.tmp_path / f"host-{n}.stdout", self.tmp_path / f"host-{n}.stderr")


def marker_of(tmp_path: Path) -> str:
    return str(tmp_path) + os.sep


@pytest.fixture(scope="session")
def airhost_bin() -> str:
    """The venv's airhost, or AIRHOST_TEST_AIRHOST: another build's (scripts/sanitize.sh runs
    tests with build/fuzz/airhost, under AddressSanitizer; it starts the airhost-rank beside it)."""
    path = os.environ.get("AIRHOST_TEST_AIRHOST") or os.path.join(os.path.dirname(sys.executable), "airhost")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: build and install airhost first (scripts/setup.sh)")
    return path


@pytest.fixture
def airhost(airhost_bin, tmp_path) -> Airhost:
    return Airhost(airhost_bin, tmp_path)


@pytest.fixture
def work(airhost) -> Path:
    """The working directory the launches of a test run in."""
    return airhost.work


@pytest.fixture(autouse=True)
def no_process_outlives_the_test(tmp_path):
    """No airhost or airhost-rank process started by a test may outlive it."""
    yield
    marker = marker_of(tmp_path)
    left = wait_until_gone(marker=marker, timeout=5.0)
    for p in left:
        try:
            os.kill(p.pid, signal.SIGKILL)  # ours: its environment carries this test's tmp path
        except ProcessLookupError:
            pass
    assert not left, "processes outlived the test:\n" + "\n".join(map(str, left))


# The files that take longest, longest first (seconds in 3 pytest-xdist workers on 2 cores,
# 2026-12-07): in workers (`--dist loadfile`, scripts/test.sh) they start first, so that no
# worker is left with a long file while the others are done. Only the order: a file missing
# here runs after them, in its usual place.
LONGEST_FIRST = (
    "test_elastic.py",        # 150-230
    "test_stacks.py",         # 140
    "test_mlflow.py",         # 105
    "test_submit_slurm.py",   # 80
    "test_gpu_offline.py",    # 100-170: waits for two wheels under scripts/test.sh
    "test_rank_usage.py",     # 70
    "test_cli_tracking.py",   # 60
    "test_multinode.py",      # 60
    "test_warm.py",           # 55
    "test_host_outlives_clients.py", "test_frameworks.py", "test_ray.py",  # 50
)


def pytest_collection_modifyitems(config, items):
    """Under scripts/test.sh the wheels build behind the suite, and test_gpu_offline.py waits for
    two of them (AIRHOST_TEST_WHEELS_READY). In one process it runs last, so that the rest of the
    suite goes on meanwhile instead of waiting with it; in pytest-xdist workers the longest
    files go first (LONGEST_FIRST), and a worker waiting for the wheels leaves the others going."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        order = {name: i for i, name in enumerate(LONGEST_FIRST)}
        position = {id(item): i for i, item in enumerate(items)}
        items.sort(key=lambda item: (order.get(item.nodeid.split("::")[0].rsplit("/", 1)[-1], len(order)),
                                     position[id(item)]))
        return
    if not os.environ.get("AIRHOST_TEST_WHEELS_READY"):
        return
    waits = [item for item in items if item.nodeid.startswith("tests/py/test_gpu_offline.py")]
    if waits:
        items[:] = [item for item in items if item not in waits] + waits


# --- where the suite's CPU goes -----------------------------------------------------------------
# On 2 cores CI's minutes are CPU (docs/testing.md): each test's CPU seconds, the pytest process's
# own and those of the processes it started and waited for (rusage of the children: the hosts,
# their ranks, kernels, compilers), go with its report, and the summary lists the costliest.
# Daemons nobody waits for (a Slurm cluster's) are not counted.
def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item._airhost_cpu0 = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and hasattr(item, "_airhost_cpu0"):
        report.user_properties.append(("cpu_s", round(_cpu_seconds() - item._airhost_cpu0, 2)))


_CPU_BY_TEST: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        for key, value in report.user_properties:
            if key == "cpu_s":
                _CPU_BY_TEST[report.nodeid] = value


def pytest_terminal_summary(terminalreporter):
    if not _CPU_BY_TEST or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    total = sum(_CPU_BY_TEST.values())
    by_file: dict[str, float] = {}
    for nodeid, cpu in _CPU_BY_TEST.items():
        by_file[nodeid.split("::")[0]] = by_file.get(nodeid.split("::")[0], 0.0) + cpu
    terminalreporter.section(f"CPU seconds: {total:.0f} in all (the test process and what it waited for)")
    for path, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[:12]:
        terminalreporter.write_line(f"{cpu:8.1f} s  {path}")
    terminalreporter.write_line("the costliest tests:")
    for nodeid, cpu in sorted(_CPU_BY_TEST.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{cpu:8.1f} s  {nodeid}")

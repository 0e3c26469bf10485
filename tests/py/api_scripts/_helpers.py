"""Shared helpers of the Python API tests (tests/py/test_api*.py, test_mlflow.py,
test_notebook.py). Test files import it with tests/py/api_scripts on sys.path; the scripts
of this folder import it the same way (their own folder is sys.path[0]).

Launches run in a child Python (one of the scripts here) so that the environment that
airhost reads in-process (AIRHOST_NVML_LIBRARY, AIRHOST_FAKE_NVML_GPUS, MLFLOW_*) is the
test's alone. Each test gets its own AIRHOST_RUNS_DIR and AIRHOST_LOCK_DIR under tmp_path,
so the run directories of a test are the entries of <tmp>/runs and its rank processes are
those whose AIRHOST_RUN_DIR lies under it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
PYTHON = sys.executable  # the .venv interpreter that runs pytest

#: Two fake H100s, as the fake NVML reads them (NAME:MIB:UUID;...).
TWO_FAKE_H100 = "NVIDIA H100 80GB HBM3:81559:GPU-aaaa-1;NVIDIA H100 80GB HBM3:81559:GPU-aaaa-2"

RESULT_TAG = "@@RESULT@@ "


def script(name: str) -> str:
    path = HERE / name
    assert path.is_file(), path
    return str(path)


def line_of(path, marker: str) -> int:
    """1-based number of the first line of `path` that contains `marker`."""
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if marker in text:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


# ---- the fake NVML ----------------------------------------------------------------------


def build_dir() -> Path:
    return Path(os.environ.get("AIRHOST_TEST_BUILD_DIR") or REPO / "build" / "dev")


def fake_nvml_library() -> str:
    """Path of the test fake of libnvidia-ml (tests/fake_nvml), built by scripts/test.sh."""
    path = build_dir() / "tests" / "fake_nvml" / "libfake-nvidia-ml.so"
    if not path.is_file():
        import pytest

        pytest.fail(
            f"{path} is missing: build it with `cmake -S {REPO} -B {build_dir()} -G Ninja "
            f"-DAIRHOST_BUILD_PYTHON=OFF && cmake --build {build_dir()} --target airhost_fake_nvml` "
            "(scripts/test.sh does it), or point AIRHOST_TEST_BUILD_DIR at a build that has it"
        )
    return str(path)


def node_has_gpus() -> bool:
    """Whether airhost sees a real GPU on this machine (checked in a child, uncached env)."""
    env = base_env(None)
    out = subprocess.run(
        [PYTHON, "-c", "import airhost._native as n; print(len(n.detect_accelerators()['gpus']))"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip() or 0) > 0


# ---- environment --------------------------------------------------------------------------

_SCRUB_PREFIXES = ("AIRHOST_", "MLFLOW_", "TORCHELASTIC_")
_SCRUB = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RANK", "LOCAL_RANK", "WORLD_SIZE",
          "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTEST_CURRENT_TEST"}
_KEEP = {"AIRHOST_TEST_BUILD_DIR"}


def base_env(tmp_path: Path | None, *, fake_gpus: str | None = None, mlflow: bool = False,
             extra: dict | None = None) -> dict:
    """The environment of a child caller: the test's own, minus anything airhost, MLflow or
    torch.distributed would read from it, plus a private runs and lock directory.

    fake_gpus: None = this node as it is; a string = use the FAKE NVML with these GPUs."""
    env = {k: v for k, v in os.environ.items()
           if k in _KEEP or not (k.startswith(_SCRUB_PREFIXES) or k in _SCRUB)}
    env["PYTHONUNBUFFERED"] = "1"
    if tmp_path is not None:
        env["AIRHOST_RUNS_DIR"] = str(runs_dir(tmp_path))
        env["AIRHOST_LOCK_DIR"] = str(tmp_path / "locks")
        env["AIRHOST_TEST_MARK"] = str(tmp_path) + os.sep  # conftest's leftover-process check
    if fake_gpus is not None:
        env["AIRHOST_NVML_LIBRARY"] = fake_nvml_library()
        env["AIRHOST_FAKE_NVML_GPUS"] = fake_gpus
    if mlflow:
        assert tmp_path is not None
        env["MLFLOW_TRACKING_URI"] = mlflow_uri(tmp_path)
    env.update(extra or {})
    return env


def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def mlflow_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def run_dirs(tmp_path: Path) -> list[Path]:
    root = runs_dir(tmp_path)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


# ---- child callers ----------------------------------------------------------------------------


@dataclasses.dataclass
class Caller:
    argv: list
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def result(self):
        """The JSON value the script reported with report(...)."""
        for line in reversed(self.out.splitlines()):
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
        raise AssertionError(f"the script reported no result\n{self.describe()}")

    def describe(self) -> str:
        return (f"$ {' '.join(map(str, self.argv))}\nexit {self.rc} after {self.seconds:.1f} s\n"
                f"--- stdout\n{self.out[-4000:]}\n--- stderr\n{self.err[-4000:]}")

    def ok(self) -> "Caller":
        assert self.rc == 0, self.describe()
        return self


def run_caller(tmp_path: Path, argv: list, *, env: dict | None = None, timeout: float = 120.0,
               cwd: Path | None = None) -> Caller:
    """Runs `python *argv` to the end (argv[0]: a script of this folder, or '-c')."""
    argv = [PYTHON, *map(str, argv)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd or tmp_path, env=env if env is not None else base_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(argv)} did not finish within {timeout} s\n--- stdout\n{out[-3000:]}"
                             f"\n--- stderr\n{err[-3000:]}")
    return Caller(argv, proc.returncode, out, err, time.monotonic() - t0)


def run_scenario(tmp_path: Path, script_name: str, scenario: str, *args, env=None, timeout=120.0) -> Caller:
    return run_caller(tmp_path, [script(script_name), scenario, *args], env=env, timeout=timeout)


class Background:
    """A child caller started in the background, its output going to files, for signals."""

    def __init__(self, tmp_path: Path, argv: list, env: dict | None = None, name: str = "caller"):
        self.tmp_path = tmp_path
        self.out_path = tmp_path / f"{name}.stdout"
        self.err_path = tmp_path / f"{name}.stderr"
        self.argv = [PYTHON, *map(str, argv)]
        self.t0 = time.monotonic()
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(self.argv, cwd=tmp_path, env=env if env is not None else base_env(tmp_path),
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_output(self, needles, timeout: float = 60.0, stream: str = "out") -> None:
        """Waits until every string of `needles` appears in the child's stdout (or stderr)."""
        def ready():
            text = self.out if stream == "out" else self.err
            return all(n in text for n in needles)
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None and not ready():
                raise AssertionError(f"the caller exited ({self.proc.returncode}) before printing {needles}\n"
                                     f"{self.describe()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needles} within {timeout} s\n{self.describe()}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 60.0) -> Caller:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the caller was still running after {timeout} s\n{self.describe()}")
        return Caller(self.argv, rc, self.out, self.err, time.monotonic() - self.t0)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


# ---- a known upstream flake ------------------------------------------------------------------

def torch_exit_abort(text: str) -> bool:
    """True when a run failed only because a rank aborted at exit with "terminate called without
    an active exception" after a gloo/DDP run: a torch 2.13 exit-time race, also seen with plain
    `python` ranks (about 1 run in 20 on a loaded 2-core machine), not an airhost fault. Tests of
    DDP training retry such a run once."""
    return "SIGABRT" in text and "terminate called without an active exception" in text


# ---- processes ----------------------------------------------------------------------------------


def _read(path: str) -> bytes:
    """The bytes of a /proc file, or b"" when it is gone."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, Z, ...), or None when there is no such process."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    try:
        return stat.rsplit(b")", 1)[1].split()[0].decode()
    except IndexError:
        return None


def is_guard(cmdline: str) -> bool:
    """The run's group guard (`airhost-rank --guard`, host/launch/procs/group_guard.hpp), not a rank."""
    return cmdline.endswith("/airhost-rank --guard")


def rank_processes(root: Path | str | None = None, guards: bool = True) -> list[str]:
    """Live (non-zombie) processes of airhost runs: those whose environment holds
    AIRHOST_RUN_ID (the ranks, what they started, and each run's guard), and, given `root`,
    whose AIRHOST_RUN_DIR lies under it; `guards=False` leaves the runs' guards out. Zombies
    are ignored: PID 1 of this container does not reap orphans. Returns 'pid [state] cmdline'
    lines."""
    found = []
    prefix = (str(root).rstrip(os.sep) + os.sep).encode() if root is not None else None
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        state = process_state(pid)
        if state is None or state in ("Z", "X"):
            continue
        env = _read(f"/proc/{pid}/environ").split(b"\0")
        if not any(v.startswith(b"AIRHOST_RUN_ID=") for v in env):
            continue
        if prefix is not None and not any(v.startswith(b"AIRHOST_RUN_DIR=" + prefix) for v in env):
            continue
        if process_state(pid) in (None, "Z", "X"):
            continue
        cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        if not guards and is_guard(cmd):
            continue
        found.append(f"{pid} [{state}] {cmd[:200]}")
    return found


def wait_no_ranks(root, timeout: float = 5.0) -> list[str]:
    """Polls until no rank process under `root` runs; returns those still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = rank_processes(root)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def kill_ranks(root) -> None:
    """Last-resort clean-up of a failed test: SIGKILL the ranks under `root` (ours only)."""
    for line in rank_processes(root):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- used by the scripts --------------------------------------------------------------------


def report(value) -> None:
    """Prints a script's result as one JSON line on the real stdout."""
    sys.__stdout__.write(RESULT_TAG + json.dumps(value) + "\n")
    sys.__stdout__.flush()


def describe_exception(e: BaseException) -> dict:
    cause = e.__cause__
    return {
        "type": type(e).__name__,
        "mro": [c.__name__ for c in type(e).__mro__],
        "message": str(e),
        "failed_ranks": getattr(e, "failed_ranks", None),
        "run_dir": getattr(e, "run_dir", None),
        "cause_type": type(cause).__name__ if cause is not None else None,
        "cause_args": [repr(a) for a in cause.args] if cause is not None else None,
    }

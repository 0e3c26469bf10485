"""`@distributed`: run a function on every accelerator of this node, get one result per rank."""
from __future__ import annotations

import codecs
import concurrent.futures
import dataclasses
import functools
import math
import os
import shutil
import signal
import sys
import sysconfig
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional

from . import _accelerators, _errors, _leases, _native, _payload, _results
from ._errors import DistributedError
from ._tracking import Tracking

DEFAULT_TIMEOUT = 10800  # 3 h, as databricks.air
DEFAULT_HANG_TIMEOUT = 1800  # 30 min: no rank making progress that long is reported (docs/hangs.md)


# ---- options --------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Options:
    """The options of `distributed(...)`, one field each, with its default: the keywords of
    distributed() are these fields, in this order (tests/py/test_api_signature.py holds them to
    it). The legacy `gpus` and `gpu_type` are read once and not kept; `gpu_model` is derived."""

    num_accelerators: Optional[int] = None
    accelerator_type: Any = None
    timeout: Optional[float] = DEFAULT_TIMEOUT
    gpus: dataclasses.InitVar[Optional[int]] = None
    gpu_type: dataclasses.InitVar[Any] = None
    tracking: Optional[bool] = None
    wait_for_accelerators: Optional[float] = None
    grace: float = 10.0
    env: Optional[Dict[str, str]] = None
    prefix: bool = True
    max_restarts: int = 0
    hang_timeout: Optional[float] = DEFAULT_HANG_TIMEOUT
    on_hang: str = "report"
    gpu_model: Optional[str] = dataclasses.field(init=False)  # the GPU model asked for, if any

    def __post_init__(self, gpus, gpu_type):
        self.gpu_model = None
        # Warnings point at the user's distributed(...): above __post_init__, __init__, distributed.
        if gpus is not None:
            warnings.warn(
                "distributed(gpus=...) is deprecated; use num_accelerators=...", FutureWarning, stacklevel=4
            )
            if self.num_accelerators is not None:
                raise ValueError("give num_accelerators or its legacy name gpus, not both")
            self.num_accelerators = gpus
        if gpu_type is not None:
            warnings.warn(
                "distributed(gpu_type=...) is deprecated; use accelerator_type=AcceleratorType....",
                FutureWarning,
                stacklevel=4,
            )
            if self.accelerator_type is not None:
                raise ValueError("give accelerator_type or its legacy name gpu_type, not both")
            self.gpu_model = _accelerators.parse_gpu_type(gpu_type)
        n = self.num_accelerators
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"num_accelerators must be a positive integer, got {n!r}")
        if self.accelerator_type is not None:
            self.accelerator_type = _accelerators.parse_accelerator_type(self.accelerator_type)
            self.gpu_model = self.accelerator_type.gpu
        timeout = self.timeout
        if timeout is not None:
            if (
                isinstance(timeout, bool)
                or not isinstance(timeout, (int, float))
                or not math.isfinite(timeout)
                or timeout <= 0
            ):
                raise ValueError(f"timeout must be a positive number of seconds, or None to disable it; got {timeout!r}")
        # None: on, unless AIRHOST_TRACKING=0 turns tracking off for the whole job.
        self.tracking = os.environ.get("AIRHOST_TRACKING", "1") != "0" if self.tracking is None else bool(self.tracking)
        self.grace = float(self.grace)
        self.env = dict(self.env or {})
        max_restarts = self.max_restarts
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or not 0 <= max_restarts <= 1000:
            raise ValueError(f"max_restarts must be an integer from 0 to 1000, got {max_restarts!r}")
        hang_timeout = self.hang_timeout
        if hang_timeout is not None and (
            isinstance(hang_timeout, bool)
            or not isinstance(hang_timeout, (int, float))
            or not math.isfinite(hang_timeout)
            or hang_timeout < 1
        ):
            raise ValueError(f"hang_timeout must be a number of seconds, at least 1, or None to turn the hang watch "
                             f"off; got {hang_timeout!r}")
        if self.on_hang not in ("report", "stop"):
            raise ValueError(f"on_hang must be 'report' (say where each rank is, and go on) or 'stop' (end the call "
                             f"as its timeout does, TimeoutError); got {self.on_hang!r}")

    def resolve_ranks(self):
        """→ (number of ranks, [(gpu index, uuid)] candidates or [] for CPU ranks). Raises
        ValueError, before anything starts, when the node cannot give what was asked."""
        node = _accelerators.detect()
        asked_type = self.accelerator_type.value if self.accelerator_type else self.gpu_model
        if not node.gpus:
            if self.gpu_model is not None:
                raise ValueError(
                    f"accelerator_type {asked_type} asks for {self.gpu_model} GPUs, but this node has "
                    f"{node.describe()}; drop accelerator_type to run CPU ranks here"
                )
            return self.num_accelerators or 1, []
        if self.gpu_model is not None and node.model != self.gpu_model:
            raise ValueError(
                f"accelerator_type {asked_type} asks for {self.gpu_model} GPUs, but this node has "
                f"{node.describe()}; drop accelerator_type or run on a matching node"
            )
        n = self.num_accelerators or len(node.gpus)
        if n > len(node.gpus):
            raise ValueError(
                f"num_accelerators={n} asks for more GPUs than this node has: {node.describe()}; "
                f"ask for at most {len(node.gpus)}"
            )
        return n, [(g.index, g.uuid) for g in node.gpus]


def _make_private_dirs(path: str) -> None:
    """Creates `path` and each missing parent 0700, as the CLI makes a run directory and a new
    runs root: logs, payloads and results are the user's alone (os.makedirs' mode would apply
    to the last folder only, the others getting 0755)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def _rank_binary() -> str:
    for d in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        path = os.path.join(d, "airhost-rank")
        if os.access(path, os.X_OK):
            return path
    return shutil.which("airhost-rank") or ""


# ---- the warm server ------------------------------------------------------------------
#
# The end of the first `.distributed()` call of a process starts one warm server
# (airhost-rank --warm-server: an interpreter with torch imported that forks the ranks),
# without waiting for it; later calls fork from it once it is ready. Started at the end, not
# the start, because its `import torch` beside the first call's ranks would slow them by as
# much on a node with few cores. It lives in a private 0700 directory, leaves within a second
# of this process (it watches its parent pid: a death signal would follow the *thread* that
# started it, and `.submit()` ends its threads), and is replaced if it dies.
# AIRHOST_WARM=0 turns it off; AIRHOST_PRELOAD chooses its modules.


class _WarmServer:
    def __init__(self):
        import subprocess
        import tempfile
        import time

        self.started = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="airhost-warm-")  # 0700
        self.socket = os.path.join(self.dir, "warm.sock")
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # as every rank gets it (host/launch/rank_env.cpp)
        env["PYTHONUNBUFFERED"] = "1"
        with open(os.path.join(self.dir, "warm.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [_rank_binary(), "--warm-server", "--socket", self.socket,
                 "--preload", os.environ.get("AIRHOST_PRELOAD", "auto"),
                 "--python", sys.executable, "--parent-pid", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        return self.alive() and os.path.exists(self.socket)

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_warm_lock = threading.Lock()
_warm_server: Optional[_WarmServer] = None


def _terminal_size(*streams) -> dict:
    """The size of the terminal the rank output is written to, for the ranks' COLUMNS and
    LINES (a tqdm bar then fits it); else the caller's COLUMNS; else nothing (a notebook)."""
    for stream in streams:
        try:
            if stream.isatty():
                size = os.get_terminal_size(stream.fileno())
                return {"terminal_columns": size.columns, "terminal_lines": size.lines}
        except (AttributeError, OSError, ValueError):
            continue
    columns = os.environ.get("COLUMNS", "")
    return {"terminal_columns": int(columns)} if columns.isdigit() else {}


# A server still importing (torch, say) is waited for: it started before this call and does
# the imports once, where a cold start does them in every rank at once, so it is ready sooner
# than cold ranks would be. Past this, it is taken for stuck, and the call starts cold.
WARM_WAIT_LIMIT = 120.0


def _warm_socket() -> tuple:
    """(the socket of this process's warm server, waited for while it starts; '' to start
    cold, with why in one line). No line for the first call of a process (it starts the server
    for the next ones) nor when warm starts are off (AIRHOST_WARM=0)."""
    import time

    if os.environ.get("AIRHOST_WARM", "1") == "0":
        return "", ""
    with _warm_lock:
        server = _warm_server
    if server is None:
        return "", ""
    t0 = time.monotonic()
    while server.alive() and not server.ready() and time.monotonic() - server.started < WARM_WAIT_LIMIT:
        time.sleep(0.01)
    if server.ready():
        return server.socket, ""
    log = os.path.join(server.dir, "warm.log")
    if not server.alive():
        return "", (f"cold start: this process's warm server (pid {server.pid}) exited with "
                    f"{server.proc.returncode} (its log: {log}); another starts after this call")
    return "", (f"cold start: this process's warm server (pid {server.pid}) is still not ready after "
                f"{time.monotonic() - server.started:.0f} s (waited {time.monotonic() - t0:.1f} s; its log: {log})")


def _ensure_warm_server() -> None:
    """After a call: starts the server for the next ones, if there is none alive."""
    global _warm_server
    if os.environ.get("AIRHOST_WARM", "1") == "0" or not _rank_binary():
        return
    with _warm_lock:
        if _warm_server is not None and _warm_server.alive():
            return
        if _warm_server is not None:
            _warm_server.stop()
        else:
            import atexit

            atexit.register(_stop_warm_server)
        try:
            _warm_server = _WarmServer()
        except OSError:  # a warm start is an optimisation, never a reason to fail a call
            _warm_server = None


def _stop_warm_server() -> None:
    global _warm_server
    with _warm_lock:
        if _warm_server is not None:
            _warm_server.stop()
            _warm_server = None


def warm_server(wait: float = 0.0) -> Optional[_WarmServer]:
    """This process's warm server (None if none was started); with `wait`, waits up to that
    many seconds for it to be ready."""
    import time

    deadline = time.monotonic() + wait
    while _warm_server is not None and not _warm_server.ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    return _warm_server


# ---- one launch -----------------------------------------------------------------------


class _Launch:
    """Prepares, runs and concludes one `.distributed()` call. Everything that can be
    wrong with the call is raised by __init__, before any process starts."""

    def __init__(self, fn: Callable, opts: _Options, args: tuple, kwargs: dict, out=None, err=None):
        self.fn = fn
        self.opts = opts
        self.out = out
        self.err = err
        self.nprocs, self._candidates = opts.resolve_ranks()
        self._payload = _payload.build(fn, args, kwargs)  # TypeError naming the culprit, before any start
        self.lease = None
        self.run = None
        self.run_dir = None
        self.payload_path = None

    def start(self, cancelled: Optional[threading.Event] = None, may_start: Callable[[], bool] = lambda: True) -> None:
        """Takes the GPUs (waiting for other runs to free them if need be), creates the run
        directory and the MLflow run, and starts the ranks. A submitted run's future: its
        `cancelled` event ends the wait for GPUs, and `may_start()` (the future turning from
        pending to running) is asked once they are held, so that a cancel that came meanwhile
        starts no rank; either way concurrent.futures.CancelledError."""
        if self._candidates:
            self.lease = _leases.acquire(
                self._candidates,
                self.nprocs,
                self.opts.wait_for_accelerators,
                lambda m: print(m, file=self._err(), flush=True),
                cancelled,
            )
        if not may_start():
            if self.lease:
                self.lease.release()
            raise concurrent.futures.CancelledError("cancelled before any rank was started")
        try:
            opts, fn = self.opts, self.fn
            run_id = _native.make_run_id()
            self.run_dir = os.path.join(_native.default_runs_root(), run_id)
            _make_private_dirs(os.path.join(self.run_dir, "logs"))
            payload_path = os.path.join(self.run_dir, "payload.pkl")
            with open(os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                for part in self._payload:
                    f.write(part)
            self._payload = None
            self.payload_path = payload_path
            self.tracking = Tracking(
                opts.tracking,
                getattr(fn, "__name__", "airhost"),
                {
                    "num_accelerators": self.nprocs,
                    "accelerator_type": opts.accelerator_type.value if opts.accelerator_type else "",
                    "function": getattr(fn, "__qualname__", repr(fn)),
                },
                out=self._err(),
            )
            env = dict(opts.env)
            for key, value in self.tracking.start(os.path.join(self.run_dir, "tracking.env")).items():
                env.setdefault(key, value)
            self.spec = {
                "kind": "pickled",
                "target": payload_path,
                "function": getattr(fn, "__qualname__", ""),  # names the run (`airhost runs`); the payload has it
                "nprocs": self.nprocs,
                "devices": self.lease.indices if self.lease else [],
                "python": sys.executable,
                "rank_binary": _rank_binary(),
                "env": env,
                "timeout": 0 if opts.timeout is None else int(math.ceil(opts.timeout)),
                "grace": opts.grace,
                "hang_timeout": float(opts.hang_timeout or 0),
                "stop_on_hang": opts.on_hang == "stop",
                "max_restarts": opts.max_restarts,
                "run_id": run_id,
                "run_dir": self.run_dir,
                "working_dir": os.getcwd(),
                "prefix": opts.prefix,
            }
            self.spec["warm_socket"], cold_why = _warm_socket()
            if cold_why:
                print(f"airhost: {cold_why}", file=self._err(), flush=True)
            self.spec.update(_terminal_size(self._out(), self._err()))
            self.run = _native.Run(self.spec)
        except BaseException:
            if self.lease:
                self.lease.release()
            if getattr(self, "tracking", None) is not None:
                self.tracking.finish("FAILED")
            raise

    def _out(self):
        return self.out or sys.stdout

    def _err(self):
        return self.err or sys.stderr

    def pump(self, timeout: float) -> bool:
        """Forwards rank output written since the last call; True once the run is over."""
        done, pieces = self.run.poll(timeout)
        if pieces:
            # The bytes come ready to show (prefixes, `\r` redraws, partial lines: see
            # Callbacks::on_console); a character cut between two pieces is decoded whole.
            if self._decoders is None:
                self._decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in (1, 2)}
            streams = {1: self._out(), 2: self._err()}
            for stream, data in pieces:
                streams[stream].write(self._decoders[stream].decode(data))
            for s in streams.values():
                s.flush()
        return done

    _decoders = None

    def wait(self):
        """Runs to the end in this thread. Ctrl-C (or Jupyter's interrupt) stops every rank
        first, then raises KeyboardInterrupt."""
        try:
            while not self.pump(0.1):
                pass
        except KeyboardInterrupt:
            self.run.cancel(signal.SIGINT)
            try:
                while not self.pump(0.1):
                    pass
            except KeyboardInterrupt:
                self.run.cancel(signal.SIGKILL)  # a second interrupt: no more grace
                while not self.pump(0.1):
                    pass
            self._conclude(interrupted=True)
            raise
        return self._conclude()

    def cancel(self, sig=signal.SIGINT):
        self.cancelled = sig
        if self.run is not None:
            self.run.cancel(sig)

    cancelled = 0

    def _conclude(self, interrupted=False):
        try:
            report = self.run.report()
            if isinstance(report, str):  # the launch never started
                self.tracking.finish("FAILED")
                raise DistributedError(f"airhost could not start the run: {report}")
            outcome = report["outcome"]
            for line in report.get("incomplete_logs") or []:
                # The cell got every line; the run directory did not (a full disk, a quota).
                warnings.warn(f"the logs of run {report['run_id']} are incomplete: {line}", ResourceWarning,
                              stacklevel=3)
            status = {"succeeded": "FINISHED", "interrupted": "KILLED"}.get(outcome, "FAILED")
            # Ctrl-C is answered at once: a run still being made is closed by its own thread.
            self.tracking.finish(status, wait=2.0 if interrupted else None)
            if interrupted:
                return None
            return _results_or_raise(report, self.opts)
        finally:
            _ensure_warm_server()
            _prune_old_runs()
            if self.lease:
                self.lease.release()
            # The ranks have read it; a captured gigabyte must not stay in the runs directory.
            if self.payload_path:
                try:
                    os.unlink(self.payload_path)
                except OSError:
                    pass


# ---- retention ------------------------------------------------------------------------
#
# Run directories do not pile up: after a call, `airhost runs prune` applies the retention
# policy (AIRHOST_RETENTION, else 30 days, 1000 runs, 20 GiB; never a live or kept run) in a
# process of its own, not waited for, at most once a minute per process (a sweep of thousands
# of calls lists the runs root once a minute, not once a call).

PRUNE_EVERY = 60.0
_last_prune = [float("-inf")]


def _prune_old_runs() -> None:
    import subprocess
    import time

    if os.environ.get("AIRHOST_RETENTION") == "off" or time.monotonic() - _last_prune[0] < PRUNE_EVERY:
        return
    _last_prune[0] = time.monotonic()
    exe = os.path.join(os.path.dirname(_rank_binary()), "airhost") if _rank_binary() else shutil.which("airhost")
    if not exe or not os.access(exe, os.X_OK):
        return
    try:
        subprocess.Popen([exe, "runs", "prune"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        pass  # pruning is housekeeping, never a reason to fail a call


def _results_or_raise(report: dict, opts: _Options) -> List[Any]:
    ranks = sorted(report["ranks"], key=lambda r: r["rank"])
    # Results over 64 KiB are mappings of shared memory (see _results.py). Neither the report
    # nor an exception keeps one: memory is held only by the values handed back.
    mapped = {}
    for r in ranks:
        if r["result"] is not None and not isinstance(r["result"], bytes):
            if report["outcome"] == "succeeded":
                mapped[r["rank"]] = r["result"]
            r["result"] = None
    _errors.raise_unless_succeeded(report, ranks, opts.timeout, opts.on_hang)
    logs = os.path.join(report["run_dir"], "logs")
    results = []
    for r in ranks:
        result = mapped.pop(r["rank"], None) or r["result"]
        if result is None:
            mapped.clear()
            raise DistributedError(
                f"rank {r['rank']} exited 0 without returning a result (did it call os._exit?). Logs: {logs}",
                [r["rank"]],
                report,
            )
        try:
            results.append(_results.loads(result))
        except Exception as e:
            mapped.clear()
            raise DistributedError(
                f"the result of rank {r['rank']} cannot be unpickled here: {e}; return plain data "
                "(numbers, lists, dicts, tensors) from the function",
                [r["rank"]],
                report,
            ) from e
        finally:
            del result
    return results


# ---- the decorator --------------------------------------------------------------------


class RunFuture(concurrent.futures.Future):
    """The Future of a run started with `.submit()`. It is pending while the run waits for
    GPUs that other runs hold, running once its ranks start. `cancel()` ends a pending one at
    once (no rank started); `stop()` does that too, or tears a running one down, which then
    ends with concurrent.futures.CancelledError."""

    _launch: Optional[_Launch] = None

    def __init__(self):
        super().__init__()
        self._cancelled = threading.Event()  # wakes a wait for GPUs

    def cancel(self) -> bool:
        if super().cancel():
            self._cancelled.set()
            return True
        return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.cancel():
            return
        if self._launch is not None:
            self._launch.cancel(sig)

    def stacks(self, timeout: float = 30.0, sample: float | None = None) -> dict:
        """Every rank's Python stacks now, as `airhost stacks --json` gives them: "groups"
        (ranks standing in the same place, the odd ones out first) and "ranks" (each rank's
        threads and frames). With `sample` (seconds): where each rank spent its time over that
        long, as `airhost stacks --sample` gives it. The run goes on. ValueError when the run is
        not running."""
        from . import _stacks

        launch = self._launch
        if launch is None or launch.run_dir is None or not self.running():
            state = "ended" if self.done() else "not started"
            where = f"; its last stacks are in {launch.run_dir}/stacks" if launch is not None and launch.run_dir else ""
            raise ValueError(f"the run has {state}: no stacks to take{where}")
        try:
            return _stacks.ask(launch.run_dir, timeout, sample)
        except ConnectionError as e:
            if self.done():
                raise ValueError(f"the run ended meanwhile; its last stacks are in {launch.run_dir}/stacks") from None
            if not os.path.exists(os.path.join(launch.run_dir, _stacks.SOCKET_NAME)):
                raise ValueError("the run is starting: its ranks are not up yet, no stacks to take") from None
            raise RuntimeError(str(e)) from None


class DistributedFunction:
    """What `@distributed` makes of a function: calling it runs it here, once;
    `.distributed(...)` runs it on every rank and returns their results in rank order."""

    def __init__(self, fn: Callable, opts: _Options):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = opts

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def distributed(self, *args, **kwargs) -> List[Any]:
        """Runs the function on every rank; returns the list of return values by global rank."""
        launch = _Launch(self.fn, self.options, args, kwargs)
        launch.start()
        return launch.wait()

    def submit(self, *args, **kwargs) -> RunFuture:
        """Starts the run and returns at once with a Future of the results list: several runs
        with fewer accelerators each can share a node (they never get the same GPU)."""
        future = RunFuture()
        launch = _Launch(self.fn, self.options, args, kwargs)  # bad input raises here, in the caller
        future._launch = launch

        def run():
            try:
                # Pending while it waits for GPUs that other runs hold; running from here.
                launch.start(future._cancelled, future.set_running_or_notify_cancel)
                if launch.cancelled:
                    launch.run.cancel(launch.cancelled)
                while not launch.pump(0.2):
                    pass
                future.set_result(launch._conclude())
            except concurrent.futures.CancelledError:
                pass  # cancelled while pending: the future says so already
            except KeyboardInterrupt as e:
                # stop() on a running future: the run was torn down as asked.
                future.set_exception(concurrent.futures.CancelledError(str(e)) if launch.cancelled else e)
            except BaseException as e:  # the Future carries it to whoever waits
                future.set_exception(e)

        threading.Thread(target=run, name=f"airhost-{launch.run_dir}", daemon=True).start()
        return future

    def job(self, *, nodes: int = 1, to: Optional[str] = None, experiment: Optional[str] = None,
            sbatch: Optional[List[str]] = None, requeue: Optional[bool] = None, **slurm):
        """Where to submit this function as a job that outlives this process:
        `train.job(nodes=2, to="slurm", partition="gpu").submit(*args, **kwargs)` returns an
        airhost.Job (run id, state, result() across nodes, cancel(), logs()).

        nodes: nodes of the job (Slurm; a local job runs on this node only).
        to: "slurm", "local" (detached on this node), or None: Slurm when sbatch is on PATH.
        experiment: the MLflow experiment of the job's one run (else MLFLOW_EXPERIMENT_NAME).
        sbatch: extra #SBATCH lines, e.g. ["--exclusive"].
        requeue: after the time-limit warning and a checkpoint, Slurm requeues the job to resume.
        partition, account, qos, time, gpus_per_node, cpus_per_task, mem, constraint, signal:
            Slurm settings, over the [slurm] table of ./airhost.toml.
        """
        from ._jobs import JobTarget

        return JobTarget(self, to, nodes, experiment, sbatch, requeue, slurm)

    def __repr__(self):
        return f"<distributed {self.fn.__qualname__}>"


def distributed(
    fn: Optional[Callable] = None,
    *,
    num_accelerators: Optional[int] = None,
    accelerator_type=None,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
    gpus: Optional[int] = None,
    gpu_type=None,
    tracking: Optional[bool] = None,
    wait_for_accelerators: Optional[float] = None,
    grace: float = 10.0,
    env: Optional[Dict[str, str]] = None,
    prefix: bool = True,
    max_restarts: int = 0,
    hang_timeout: Optional[float] = DEFAULT_HANG_TIMEOUT,
    on_hang: str = "report",
):
    """Decorates a function so that `fn.distributed(*args, **kwargs)` runs it on every rank.

    num_accelerators: ranks; default every GPU of the node (1 CPU rank without GPUs).
    accelerator_type: an AcceleratorType or its name ("GPU_8xH100"); checked against the node.
    timeout: seconds before every rank is stopped and TimeoutError raised; None disables.
    gpus, gpu_type: legacy names of num_accelerators and the GPU model (FutureWarning).
    tracking: create an MLflow run per call when mlflow is importable (default: yes, unless
        the environment has AIRHOST_TRACKING=0).
    wait_for_accelerators: seconds to wait for GPUs held by other runs (None: as long as needed).
    grace: seconds between SIGTERM and SIGKILL when the ranks are stopped.
    env: extra environment variables for every rank.
    prefix: put "[rank N] " before every line of rank output.
    max_restarts: after a rank fails, stop every rank and run the function again on all of
        them, up to this many times (ranks see TORCHELASTIC_RESTART_COUNT); the results are
        the last attempt's. A timeout or an interrupt is never restarted.
    hang_timeout: seconds with no rank making progress after which airhost prints where each
        rank is (docs/hangs.md); None turns the hang watch off. Default 30 minutes.
    on_hang: "report" (the call goes on) or "stop" (it ends as its timeout does: TimeoutError).
    """
    options = dict(locals())  # the keywords, each an _Options field
    del options["fn"]
    if fn is not None and not callable(fn):
        if isinstance(fn, int) and num_accelerators is None:  # distributed(8): positional count
            options["num_accelerators"], fn = fn, None
        else:
            raise TypeError("use @distributed or @distributed(num_accelerators=..., ...)")
    opts = _Options(**options)
    if fn is not None:
        return DistributedFunction(fn, opts)
    return lambda f: DistributedFunction(f, opts)

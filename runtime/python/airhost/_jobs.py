"""Jobs: a `@distributed` function run past this process, on Slurm or detached on this node.

    job = train.job(nodes=2, to="slurm", partition="gpu").submit(epochs=3)
    job.run_id            # '20261205-061102-ab492d': the run of `airhost runs`
    job.result()          # one value per global rank, in rank order, across the nodes
    Job(run_id).result()  # the same from another process (a restarted notebook kernel)

A job is an `airhost submit` of the pickled function (`--pickled FILE`): the run, its run
directory (on a file system every node sees), its record and its logs are those of any
submitted run, so `airhost runs`, `logs` and `cancel` work on it, and the job outlives the
process that submitted it. Each node's host keeps its ranks' return values in its run
directory (results/rank-N.pkl, node K's in node-K/), where `result()` reads them back.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any, Dict, List, Optional

from . import _errors, _payload

ENDED = frozenset({"succeeded", "failed", "cancelled", "interrupted", "timed_out", "node_lost", "not_started",
                   "preempted"})

# [slurm] settings a job takes as keywords: the flags of `airhost submit` (docs/jobs.md).
_SLURM_KEYS = ("partition", "account", "qos", "time", "gpus_per_node", "cpus_per_task", "mem", "constraint", "signal")


def _airhost() -> str:
    """The airhost executable installed with this package (as `python -m airhost` finds it)."""
    for d in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        path = os.path.join(d, "airhost")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("airhost")
    if not found:
        raise RuntimeError("the airhost executable is not installed beside this Python; reinstall airhost")
    return found


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_airhost(), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    text = lines[-1] if lines else "no message"
    return text[len("airhost: "):] if text.startswith("airhost: ") else text


class JobTarget:
    """Where and how a `@distributed` function is submitted; `.submit(*args, **kwargs)` does it."""

    def __init__(self, fn, to: Optional[str], nodes: int, experiment: Optional[str],
                 sbatch: Optional[List[str]], requeue: Optional[bool], slurm: Dict[str, Any]):
        # fn: the DistributedFunction (_api.py) whose .job() this is: its .fn and .options.
        if to not in (None, "local", "slurm"):
            raise ValueError(f"to= takes 'local' or 'slurm' (or None: Slurm when sbatch is on PATH), got {to!r}")
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
        unknown = sorted(set(slurm) - set(_SLURM_KEYS))
        if unknown:
            raise TypeError(f"job() got unknown Slurm setting(s) {', '.join(unknown)}; it takes {', '.join(_SLURM_KEYS)}"
                            " and sbatch=[...] for other #SBATCH lines")
        self.fn = fn
        self.to = to
        self.nodes = nodes
        self.experiment = experiment
        self.sbatch = list(sbatch or [])
        self.requeue = requeue
        self.slurm = slurm

    def _argv(self, payload_path: str) -> List[str]:
        o = self.fn.options
        argv = ["submit", "--nodes", str(self.nodes)]
        if self.to:
            argv += ["--to", self.to]
        for key in _SLURM_KEYS:
            if self.slurm.get(key) is not None:
                argv += ["--" + key.replace("_", "-"), str(self.slurm[key])]
        for line in self.sbatch:
            argv += ["--sbatch", line]
        if self.requeue is not None:
            argv.append("--requeue" if self.requeue else "--no-requeue")
        argv += ["--pickled", payload_path, "--python", sys.executable]
        if o.num_accelerators is not None:
            argv += ["-n", str(o.num_accelerators)]
        argv += ["--timeout", "0" if o.timeout is None else f"{int(-(-o.timeout // 1))}s"]
        argv += ["--grace", f"{o.grace:g}s", "--max-restarts", str(o.max_restarts)]
        argv += ["--tracking" if o.tracking else "--no-tracking"]
        if not o.prefix:
            argv.append("--no-prefix")
        for key, value in o.env.items():
            argv += ["--env", f"{key}={value}"]
        if self.experiment:
            argv += ["--experiment", self.experiment]
        return argv

    def submit(self, *args, **kwargs) -> "Job":
        """Submits the function with these arguments; returns the Job at once. Bad input (an
        unpicklable argument, a Slurm setting sbatch refuses) raises here, with nothing left."""
        parts = _payload.build(self.fn.fn, args, kwargs)
        staging = tempfile.mkdtemp(prefix="airhost-job-")
        try:
            name = getattr(self.fn.fn, "__name__", "function")
            path = os.path.join(staging, (name if name.isidentifier() else "function") + ".pkl")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                for part in parts:
                    f.write(part)
            done = _cli(*self._argv(path))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if done.returncode != 0:
            raise ValueError(f"airhost submit refused the job: {_one_line(done.stderr)}")
        return Job(done.stdout.split()[0])


class Job:
    """A submitted run, by its run id: its state, its results, its logs; `Job(run_id)` attaches
    to one from any process of this user (a full id, a unique prefix, or "latest")."""

    def __init__(self, run_id: str):
        shown = _cli("runs", "show", run_id, "--json")
        if shown.returncode != 0:
            raise ValueError(_one_line(shown.stderr))
        record = json.loads(shown.stdout)
        self.run_id: str = record["run_id"]
        self.run_dir: str = record["run_dir"]
        self._last = record

    # ---- state ----

    def record(self) -> dict:
        """The run as `airhost runs show ID --json` gives it now (state, exit code, nodes, ...)."""
        shown = _cli("runs", "show", self.run_id, "--json")
        if shown.returncode == 0:
            self._last = json.loads(shown.stdout)
        return self._last

    @property
    def state(self) -> str:
        """pending, starting, running, requeued, succeeded, failed, cancelled, interrupted,
        timed_out, node_lost, not_started, preempted, or lost (its host is gone without recording
        the end)."""
        return self.record()["state"]

    @property
    def scheduler_job_id(self) -> Optional[str]:
        return self._last.get("scheduler_job_id")

    def done(self) -> bool:
        return self.state in ENDED or self._last["state"] == "lost"

    def wait(self, timeout: Optional[float] = None, poll: float = 0.5) -> str:
        """Waits until the run has ended (or is lost); returns its state. TimeoutError after
        `timeout` seconds, the job going on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} is still {self._last['state']} after {timeout} s; it goes on")
            time.sleep(poll)
        return self._last["state"]

    # ---- results ----

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        """The return values of every rank of every node, by global rank, once the run has
        ended; DistributedError with the failing rank's remote traceback if it failed."""
        state = self.wait(timeout)
        nodes = self._node_records()
        logs = os.path.join(self.run_dir, "logs")
        if state != "succeeded":
            raise self._error(state, nodes, logs)
        results = {}
        for node in nodes:
            for r in node.get("ranks", []):
                path = os.path.join(node["run_dir"], "results", f"rank-{r['rank']}.pkl")
                try:
                    with open(path, "rb") as f:
                        results[r["rank"]] = pickle.load(f)
                except FileNotFoundError:
                    raise _errors.DistributedError(
                        f"rank {r['rank']} of run {self.run_id} left no result ({path}); did it call os._exit? "
                        f"Logs: {os.path.join(node['run_dir'], 'logs')}", [r["rank"]], node) from None
        world = max(1, int(self._last.get("nnodes") or 1)) * int(self._last.get("nprocs") or 0)
        missing = [k for k in range(world) if k not in results]
        if missing:
            raise _errors.DistributedError(f"run {self.run_id} has no result of rank(s) {missing}; its nodes' "
                                           f"records are {[n['run_dir'] for n in nodes]}", missing)
        return [results[k] for k in sorted(results)]

    def _node_records(self) -> List[dict]:
        records = []
        for node in self._last.get("nodes") or [{"run_dir": self.run_dir}]:
            try:
                with open(os.path.join(node["run_dir"], "run.json")) as f:
                    records.append(json.load(f))
            except (OSError, ValueError):
                continue
        return records

    def _error(self, state: str, nodes: List[dict], logs: str) -> BaseException:
        if state == "timed_out":
            return TimeoutError(f"run {self.run_id} reached its timeout and every rank was stopped. Logs: {logs}")
        if state in ("cancelled", "interrupted"):
            import concurrent.futures

            return concurrent.futures.CancelledError(f"run {self.run_id} was {state}")
        ranks = [dict(r, _node=n) for n in nodes for r in n.get("ranks", [])]
        failed = sorted((r for r in ranks if r["state"] == "failed"), key=lambda r: r["rank"])
        if not failed:
            message = self._last.get("problem") or self._last.get("message") or state
            return _errors.DistributedError(f"run {self.run_id} {state}: {message}. Logs: {logs}", [], self._last)
        # The root cause is the failed rank a node named as its own (the first to fail there).
        root = next((r for r in failed if r["rank"] == r["_node"].get("root_cause")), failed[0])
        lines = _errors.failure_lines(failed, len(ranks), root)
        lines.append(f"Logs: {os.path.join(root['_node']['run_dir'], 'logs')}")
        err = _errors.DistributedError("\n".join(lines), [r["rank"] for r in failed], self._last)
        try:
            with open(os.path.join(root["_node"]["run_dir"], "results", f"rank-{root['rank']}.exception.pkl"), "rb") as f:
                cause = pickle.load(f)
            if isinstance(cause, BaseException):
                err.__cause__ = cause
        except Exception:
            pass
        return err

    # ---- control ----

    def cancel(self) -> str:
        """Stops the run (scancel under Slurm) and waits until it has ended; returns its state.
        A run that has ended already is left as it is."""
        done = _cli("cancel", self.run_id)
        if done.returncode != 0 and not self.done():
            raise RuntimeError(f"cannot cancel run {self.run_id}: {_one_line(done.stderr)}")
        return self.state

    def stacks(self, sample: float | None = None) -> dict:
        """Every rank's Python stacks now, as `airhost stacks --json` gives them: "groups"
        (ranks standing in the same place, the odd ones out first) and "ranks" (each rank's
        threads and frames). With `sample` (seconds): where each rank spent its time over that
        long, as `airhost stacks --sample` gives it ("groups" by the function each rank spends
        most samples in, "ranks" with every function's own and total share and the rank's CPU).
        The run goes on. ValueError for a run that is not running (how it ended and where its
        last stacks are), RuntimeError when its host does not answer."""
        args = ["--sample", f"{int(round(sample * 1000))}ms"] if sample is not None else []
        done = _cli("stacks", self.run_id, "--json", *args)
        if done.returncode == 2:
            raise ValueError(_one_line(done.stderr))
        if done.returncode != 0:
            raise RuntimeError(_one_line(done.stderr))
        return json.loads(done.stdout)

    def logs(self, rank: Optional[int] = None, node: Optional[int] = None, tail: Optional[int] = None) -> str:
        """The ranks' output so far (stdout, then stderr), as `airhost logs` prints it."""
        argv = ["logs", self.run_id]
        if rank is not None:
            argv += ["--rank", str(rank)]
        if node is not None:
            argv += ["--node", str(node)]
        if tail is not None:
            argv += ["--tail", str(tail)]
        done = _cli(*argv)
        if done.returncode != 0:
            # No rank has started yet: the CLI said so, or the run was still pending or starting
            # when it looked (it may have moved on since, so its words count, not today's state).
            if "has no rank logs yet" in done.stderr or self.state in ("pending", "starting"):
                return ""
            raise ValueError(_one_line(done.stderr))
        return done.stdout + done.stderr

    def __repr__(self):
        return f"<airhost.Job {self.run_id} {self._last.get('state', '?')}>"

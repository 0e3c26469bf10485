"""An MLflow run per `.distributed()` call, when mlflow is installed, made beside the ranks'
start rather than before it.

Importing mlflow takes a second or more of CPU; done before the ranks start, every call
would wait for it, and done beside their start it slows them by as much. So when mlflow is
not imported in the caller yet, a thread of the caller waits until a rank imports mlflow (it
creates <file>.want), the call ends, or DEFER_SECONDS pass, then imports mlflow, creates the
run, and writes its variables (MLFLOW_RUN_ID, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID) to
a file in the run directory. (With mlflow imported already, as from the second call of a
notebook on, the run is made at once: it costs milliseconds.) Ranks get
AIRHOST_MLFLOW_PENDING=<that file>; a rank binds the run when it imports mlflow
(bootstrap.py), waiting for the file if need be, so a plain `mlflow.log_metric(...)` on any
rank lands in the run, and a rank that never touches mlflow never waits. The host CLI does
the same with a helper process (host/cli/tracking.hpp).

The run is nested under the caller's active run, if any. Ranks that end their fluent run at
exit mark it FINISHED; finish() sets the final status afterwards, so the run always ends
FINISHED, FAILED or KILLED by the call's real outcome.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from typing import Dict, Optional

from ._usage_metrics import log_rank_usage

DEFAULT_EXPERIMENT = "airhost"
DEFER_SECONDS = 15.0  # past the ranks' start-up


def _publish(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Tracking:
    def __init__(self, enabled: bool, run_name: str, params: Dict[str, object], out=None):
        # find_spec of a top-level name looks for it without importing it.
        self.enabled = bool(enabled) and importlib.util.find_spec("mlflow") is not None
        self.run_name = run_name
        self.params = params
        self.run_id: Optional[str] = None
        self._client = None
        self._thread: Optional[threading.Thread] = None
        self._ending = threading.Event()
        self._out = out or sys.stderr
        # Between the thread that makes the run and finish(): whether the run was made (or
        # could not be), the call's final status, and whether finish() stopped waiting for it.
        self._lock = threading.Lock()
        self._made = False
        self._status: Optional[str] = None
        self._detached = False

    @property
    def active(self) -> bool:
        return self.enabled and self._thread is not None

    def start(self, env_file: str) -> Dict[str, str]:
        """Starts creating the run; returns at once with the variables that point ranks at it."""
        if not self.enabled:
            return {}
        # What only the caller's thread can tell: its active run (the parent) and experiment.
        # Without mlflow imported here yet, the caller has neither.
        parent = experiment_id = None
        mlflow = sys.modules.get("mlflow")
        if mlflow is not None:
            try:
                active = mlflow.active_run()
                parent = active.info.run_id if active else None
                fluent = sys.modules.get("mlflow.tracking.fluent")
                experiment_id = getattr(fluent, "_active_experiment_id", None)
            except Exception:
                pass
        self._run_dir = os.path.dirname(env_file)
        self._thread = threading.Thread(
            target=self._create,
            args=(env_file, parent, experiment_id, mlflow is None),
            name="airhost-mlflow",
            daemon=True,
        )
        self._thread.start()
        return {"AIRHOST_MLFLOW_PENDING": env_file}

    def _create(self, env_file: str, parent: Optional[str], experiment_id: Optional[str], defer: bool) -> None:
        try:
            self._make(env_file, parent, experiment_id, defer)
        finally:
            with self._lock:
                self._made = True
                detached = self._detached
            if detached:  # finish() went on without it: the run is closed here
                self._close()

    def _make(self, env_file: str, parent: Optional[str], experiment_id: Optional[str], defer: bool) -> None:
        if defer:
            deadline = time.monotonic() + DEFER_SECONDS
            while time.monotonic() < deadline and not os.path.exists(env_file + ".want"):
                if self._ending.wait(0.05):
                    break
        try:
            import mlflow
            from mlflow.tracking import MlflowClient

            client = MlflowClient()
            experiment_id = experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID")
            if not experiment_id:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
                found = client.get_experiment_by_name(name)
                if found is None:
                    try:
                        experiment_id = client.create_experiment(name)
                    except Exception:  # made meanwhile by a concurrent call
                        experiment_id = client.get_experiment_by_name(name).experiment_id
                else:
                    experiment_id = found.experiment_id
            tags = {"airhost.entry": self.run_name}
            if parent:
                tags["mlflow.parentRunId"] = parent
            run = client.create_run(experiment_id, tags=tags, run_name=self.run_name)
            self.run_id, self._client = run.info.run_id, client
            try:
                # One write for all (a transaction each on SQLite otherwise): this runs beside
                # the ranks' start, on every call.
                from mlflow.entities import Param

                client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in self.params.items()])
            except Exception as e:  # params are a nicety; the run itself matters
                print(f"airhost: could not log parameters to MLflow: {e}", file=self._out)
            uri = mlflow.get_tracking_uri()
            lines = [f"MLFLOW_RUN_ID={self.run_id}", f"MLFLOW_TRACKING_URI={uri}", f"MLFLOW_EXPERIMENT_ID={experiment_id}"]
            if uri.startswith("sqlite:"):
                lines.append("AIRHOST_MLFLOW_RETRY=1")  # see bootstrap.py: SQLite's lock upgrades
            _publish(env_file, "\n".join(lines) + "\n")
            if uri.startswith(("http://", "https://", "databricks")):
                where = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{self.run_id}"
            else:
                where = f"run {self.run_id}; view it with: mlflow ui --backend-store-uri {uri}"
            print(f"airhost: MLflow {where}", file=self._out, flush=True)
        except Exception as e:
            first = (str(e).splitlines() or [type(e).__name__])[0][:300]
            try:
                _publish(env_file, f"NONE={first}\n")
            except OSError:
                pass
            print(
                f"airhost: mlflow is installed but no run could be created ({first}); training without "
                "tracking (check MLFLOW_TRACKING_URI, or pass tracking=False)",
                file=self._out,
                flush=True,
            )

    def finish(self, status: str, wait: Optional[float] = None) -> None:
        """status: FINISHED, FAILED or KILLED. Waits for the run to exist first, up to `wait`
        seconds (None: FINISH_WAIT). A run still being made then (mlflow imported only now,
        a fresh database migrated, a server slow to answer) is left to the thread that makes
        it, which closes it with `status` once it exists; the caller goes on, and at exit the
        interpreter waits up to EXIT_WAIT for such runs (Ctrl-C skips the wait)."""
        if self._thread is None:
            return
        with self._lock:
            self._status = status
        self._ending.set()
        self._thread.join(FINISH_WAIT if wait is None else wait)
        with self._lock:
            if not self._made:
                self._detached = True
                _unfinished.add(self._thread)
                _register_exit_wait()
                return
        self._thread = None
        self._close()

    def _close(self) -> None:
        if self.run_id is None:
            return
        try:
            # Ranks' exit handlers may have ended the run as FINISHED meanwhile: the call's
            # outcome is what the run must say.
            self._client.set_terminated(self.run_id, status=self._status)
        except Exception as e:
            print(f"airhost: could not close MLflow run {self.run_id}: {e}", file=self._out)
        self._log_rank_usage()

    def _log_rank_usage(self) -> None:
        """What each rank used, sampled by the host every 5 s into <run_dir>/metrics/ranks.jsonl
        (host/launch/rank_usage.hpp): system metrics per rank, as the CLI's run gets them
        (cli/tracking.cpp), at most 2000 points a series. A call under 5 s has none."""
        path = os.path.join(getattr(self, "_run_dir", "") or "", "metrics", "ranks.jsonl")
        try:
            log_rank_usage(self._client, self.run_id, path)
        except Exception as e:
            print(f"airhost: could not log the ranks' CPU and memory to MLflow run {self.run_id}: {e}", file=self._out)


# How long finish() waits for a run still being made, and the interpreter's exit for the runs
# left to their threads.
FINISH_WAIT = 60.0
EXIT_WAIT = 60.0
_unfinished: "set[threading.Thread]" = set()
_exit_wait_registered = [False]


def _register_exit_wait() -> None:
    if _exit_wait_registered[0]:
        return
    _exit_wait_registered[0] = True
    import atexit

    atexit.register(_wait_for_unfinished_runs)


def _wait_for_unfinished_runs() -> None:
    alive = [t for t in _unfinished if t.is_alive()]
    if not alive:
        return
    print(f"airhost: waiting up to {EXIT_WAIT:.0f} s for MLflow to record {len(alive)} call(s) that ended while "
          "their run was being made (Ctrl-C to skip)", file=sys.stderr, flush=True)
    deadline = time.monotonic() + EXIT_WAIT
    try:
        for t in alive:
            t.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass

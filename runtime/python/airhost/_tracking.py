"""An MLflow run per launch, when mlflow is importable.

The caller creates the run (nested under the active one, if any) and hands its id to the
ranks through MLFLOW_RUN_ID / MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_ID, so a plain
`mlflow.log_metric(...)` on any rank lands in it. Ranks that end their fluent run at exit
mark it FINISHED; the caller sets the final status afterwards, so the run always ends
FINISHED, FAILED or KILLED by the launch's real outcome.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Optional

DEFAULT_EXPERIMENT = "airhost"


def _import_mlflow():
    try:
        import mlflow  # noqa: F401
    except Exception:  # not installed, or broken: tracking is an extra, never a blocker
        return None
    return mlflow


class Tracking:
    def __init__(self, enabled: bool, run_name: str, params: Dict[str, object], out=None):
        self.mlflow = _import_mlflow() if enabled else None
        self.run_name = run_name
        self.params = params
        self.run_id: Optional[str] = None
        self._started_fluent = False
        self._out = out or sys.stderr

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def start(self) -> Dict[str, str]:
        """Creates the run; returns the variables that point ranks at it."""
        mlflow = self.mlflow
        if mlflow is None:
            return {}
        from mlflow.tracking import fluent

        if not (
            os.environ.get("MLFLOW_EXPERIMENT_NAME")
            or os.environ.get("MLFLOW_EXPERIMENT_ID")
            or getattr(fluent, "_active_experiment_id", None)
        ):
            mlflow.set_experiment(DEFAULT_EXPERIMENT)
        parent = mlflow.active_run()
        run = mlflow.start_run(run_name=self.run_name, nested=parent is not None)
        self._started_fluent = True
        self.run_id = run.info.run_id
        try:
            mlflow.log_params({k: str(v) for k, v in self.params.items()})
        except Exception as e:  # params are a nicety; the run itself matters
            print(f"airhost: could not log parameters to MLflow: {e}", file=self._out)
        uri = mlflow.get_tracking_uri()
        experiment_id = run.info.experiment_id
        if uri.startswith(("http://", "https://", "databricks")):
            where = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{self.run_id}"
        else:
            where = f"run {self.run_id}; view it with: mlflow ui --backend-store-uri {uri}"
        print(f"airhost: MLflow {where}", file=self._out, flush=True)
        env = {
            "MLFLOW_RUN_ID": self.run_id,
            "MLFLOW_TRACKING_URI": uri,
            "MLFLOW_EXPERIMENT_ID": experiment_id,
        }
        if uri.startswith("sqlite:"):
            env["AIRHOST_MLFLOW_RETRY"] = "1"  # see bootstrap.py: SQLite's lock upgrades
        return env

    def finish(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        if not self.active:
            return
        mlflow = self.mlflow
        try:
            if self._started_fluent and mlflow.active_run() and mlflow.active_run().info.run_id == self.run_id:
                mlflow.end_run(status=status)
            # Ranks' exit handlers may have ended the run as FINISHED meanwhile: the launch's
            # outcome is what the run must say.
            mlflow.tracking.MlflowClient().set_terminated(self.run_id, status=status)
        except Exception as e:
            print(f"airhost: could not close MLflow run {self.run_id}: {e}", file=self._out)

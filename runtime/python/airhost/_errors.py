"""How a run that did not succeed ends the call: DistributedError, with each failed rank in a
line and the remote traceback of the rank that failed first; TimeoutError; KeyboardInterrupt.
The Python API (_api.py) raises them from the host's report of a run, a Job (_jobs.py) from
the records its nodes left."""
from __future__ import annotations

import os
import pickle
import signal
from typing import List, Optional


class DistributedError(RuntimeError):
    """A rank failed. `failed_ranks`, `report` (the run's outcome per rank) and `run_dir`
    (logs, run.json) tell the rest; `__cause__` is the rank's own exception when it could
    be rebuilt in this process."""

    def __init__(self, message: str, failed_ranks=(), report: Optional[dict] = None):
        super().__init__(message)
        self.failed_ranks: List[int] = list(failed_ranks)
        self.report = report
        self.run_dir = report["run_dir"] if report else None


# Named where it was defined first, as tracebacks showed it and pickles (a rank's exception, a
# job's results) name it: an airhost of before the move still finds it there.
DistributedError.__module__ = "airhost._api"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def rank_failure(r: dict) -> str:
    """One line: how rank `r` (a rank of a run's report) ended."""
    if r["signal"]:
        what = f"was killed by {signal_name(r['signal'])}"
    else:
        what = f"exited with code {r['exit_code']}"
    if r.get("error"):
        first = (r["error"]["message"] or "").splitlines()[:1]
        what += f": {r['error']['type']}" + (f": {first[0]}" if first else "")
    return f"rank {r['rank']} (pid {r['pid']}) {what}"


def failure_lines(failed: List[dict], total: int, root: Optional[dict]) -> List[str]:
    """The lines a DistributedError opens with: which of the `total` ranks failed, how each
    did, and the remote traceback of `root`, the rank that failed first."""
    lines = [f"{len(failed)} of {total} rank(s) failed: " + ", ".join(str(r["rank"]) for r in failed)]
    lines += ["  " + rank_failure(r) for r in failed]
    if root is not None:
        if root.get("error") and root["error"].get("traceback"):
            lines.append(f"Remote traceback of rank {root['rank']}:")
            lines.append(root["error"]["traceback"].rstrip("\n"))
        else:
            lines.append(f"Rank {root['rank']} reported no Python exception; see {root['stderr_log']}")
    return lines


def raise_unless_succeeded(report: dict, ranks: List[dict], timeout, on_hang: str) -> None:
    """Raises what a run of the Python API that did not succeed ends the call with: TimeoutError
    (its timeout, or a hang with on_hang='stop'), KeyboardInterrupt, or DistributedError with
    the first failed rank's own exception as its cause when it unpickles here. `ranks`: the
    report's ranks by rank; `timeout`, `on_hang`: the call's options."""
    outcome = report["outcome"]
    if outcome == "succeeded":
        return
    logs = os.path.join(report["run_dir"], "logs")
    stacks = os.path.join(report["run_dir"], "stacks")
    if outcome == "timed_out" and report.get("hang") and on_hang == "stop":
        raise TimeoutError(
            f"the run hung ({report['hang']}) and every rank was stopped (on_hang='stop'); where each "
            f"rank stood is in {stacks}. Logs: {logs}"
        )
    if outcome == "timed_out":
        # Its timeout ended it; a hang reported before (on_hang='report') is said, not blamed.
        hung = f" It had been reported hung first ({report['hang']}); where each rank stood is in {stacks}." \
            if report.get("hang") else ""
        raise TimeoutError(
            f"the run timed out after {timeout} s and every rank was stopped; raise timeout= "
            f"(or None to disable it).{hung} Logs: {logs}"
        )
    if outcome == "interrupted":
        raise KeyboardInterrupt(f"the run was interrupted by {signal_name(report['interrupt_signal'])}")
    failed = [r for r in ranks if r["state"] == "failed"]
    root = next((r for r in ranks if r["rank"] == report["root_cause"]), failed[0] if failed else None)
    lines = failure_lines(failed, len(ranks), root)
    cause = None
    if root is not None and root["error"] and root["error"]["pickled"]:
        try:
            cause = pickle.loads(root["error"]["pickled"])
        except Exception:
            cause = None
    hint = report.get("message", "").partition("; this node has no GPU")[2]
    if hint:  # CUDA or NCCL failed on CPU ranks: what happened and what to do, last, read first
        lines.append("This node has no GPU" + hint + ".")
    lines.append(f"Logs: {logs}")
    err = DistributedError("\n".join(lines), [r["rank"] for r in failed], report)
    if isinstance(cause, BaseException):
        raise err from cause
    raise err

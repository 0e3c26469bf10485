#!/usr/bin/env python3
"""bench/elastic.py — an elastic job (--nnodes 2:3) losing a node and taking one in, airhost
against torchrun --rdzv-backend c10d, on this machine, in the same run.

Three nodes on 127.0.0.1, one gloo rank each (bench/scripts/elastic_rank.py: it stamps when its
group has met, then trains on). Two figures, each the median of --repeats runs:

    shrink   a node dies (its host and its rank SIGKILLed together, as a machine that goes
             away) -> every remaining rank back in a group of 2, past its first all_reduce
    grow     a third node's launcher starts while 2 nodes train -> every rank of the group of
             3 past its first all_reduce

airhost cold, airhost warm (ranks forked by `airhost warm start --preload torch`, when built)
and torchrun (its agents' --monitor-interval 0.1, --max-restarts 10). Both wait the same 1 s for
more nodes once MIN have come (airhost --join-settle 1s, torchrun's last_call_timeout=1; its
default is 30 s), and airhost takes a node in at once (--scale-up-interval 0s; its default, 1
min, bounds how often a stream of arrivals restarts the job). Every job is checked: the ranks
of each group all stamped, no process left once its launchers are killed.

    .venv/bin/python bench/elastic.py [--repeats 3] [--json-file elastic.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "scripts" / "elastic_rank.py"


def log(msg: str) -> None:
    print(f"[elastic {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc's children lists (a torchrun agent starts its
    workers in sessions of their own: killing its process group leaves them running)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def kill_tree(pid: int) -> None:
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """Up to three launchers of one elastic job, each in a session of its own (its node)."""

    def __init__(self, args, kind: str, root: Path, env: dict):
        self.args, self.kind = args, kind
        self.dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
        self.stamps = self.dir / "stamps"
        self.stamps.mkdir()
        self.port = free_port()
        self.env = dict(env, ELASTIC_STAMPS=str(self.stamps), AIRHOST_RUNS_DIR=str(self.dir / "runs"))
        self.procs: list[subprocess.Popen] = []
        self.killed: set[int] = set()

    def start_node(self, first: bool) -> float:
        n = len(self.procs)
        if self.kind.startswith("airhost"):
            argv = [self.args.airhost, str(RANK), "-n", "1", "--nnodes", "2:3", "--master-addr", "127.0.0.1",
                    "--master-port", str(self.port), "--join-settle", "1s", "--scale-up-interval", "0s",
                    "--node-timeout", "10", "--grace", "2", *(["--node-rank", "0"] if first else [])]
            if self.kind == "airhost":
                argv.append("--cold")
        else:
            argv = [self.args.torchrun, "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "elastic", "--max-restarts", "10",
                    "--monitor-interval", "0.1", "--rdzv-conf", "last_call_timeout=1,join_timeout=120", str(RANK)]
        t = time.time()
        with open(self.dir / f"node-{n}.log", "wb") as out:
            self.procs.append(subprocess.Popen(argv, env=self.env, cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))
        return t

    def up(self, world: int, after: float = 0, timeout: float = 120) -> float | None:
        """When every rank of a group of `world` had met (the last stamp), or None."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = []
            for p in self.stamps.glob(f"up-{world}-*"):
                if p.name.endswith(".tmp"):
                    continue
                try:
                    t = float(p.read_text())
                except (OSError, ValueError):
                    continue
                if t > after:
                    got.append(t)
            if len(got) >= world:
                return max(got)
            if any(p.poll() is not None for i, p in enumerate(self.procs) if i not in self.killed):
                return None  # a launcher ended by itself: the job failed
            time.sleep(0.01)
        return None

    def kill_node(self, n: int) -> float:
        pids = [self.procs[n].pid, *descendants(self.procs[n].pid)]
        t = time.time()
        for p in pids:  # the machine goes: its launcher and its ranks at once
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs[n].wait()
        self.killed.add(n)
        return t

    def stop(self) -> None:
        for p in self.procs:
            kill_tree(p.pid)
            p.wait()
        mark = f"ELASTIC_STAMPS={self.stamps}".encode()
        for d in Path("/proc").glob("[0-9]*"):  # a worker whose agent went first (init adopted it)
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    os.kill(int(d.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        if not self.args.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def why_failed(job: Job) -> str:
    """The last error line of the job's launchers' logs: what ended the attempt."""
    for log_file in sorted(job.dir.glob("node-*.log")):
        lines = [l.strip() for l in log_file.read_text(errors="replace").splitlines()
                 if "Error" in l and not l.lstrip().startswith("[rank")]
        if lines:
            return lines[-1][:200]
    return "no group formed, and no error was logged"


def measure(args, kind: str, root: Path, env: dict) -> dict:
    """Each figure's seconds over the counted runs, and why any run of it failed."""
    out: dict = {"shrink_s": [], "grow_s": [], "failures": {"shrink_s": [], "grow_s": []}}

    def one(key: str, before: int, event, after: int, counted: bool) -> str:
        job = Job(args, kind, root, env)
        try:
            for k in range(before):
                job.start_node(k == 0)
            if job.up(before) is None:
                out["failures"][key].append(f"the group of {before} never met: {why_failed(job)}")
                return "failed"
            time.sleep(0.5)
            t0 = event(job)
            t1 = job.up(after, after=t0)
            if t1 is None:
                out["failures"][key].append(why_failed(job))
                return "failed"
            if counted:
                out[key].append(t1 - t0)
            return f"{t1 - t0:.2f} s"
        finally:
            job.stop()

    for i in range(args.repeats + 1):  # the first run warms the page cache: not counted
        shrink = one("shrink_s", 3, lambda job: job.kill_node(2), 2, i > 0)
        grow = one("grow_s", 2, lambda job: job.start_node(False), 3, i > 0)
        log(f"{kind}: run {i}{' (not counted)' if not i else ''}: shrink {shrink}, grow {grow}")
    return {k: ({"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None)
            for k, v in out.items() if k != "failures"} | {"failures": out["failures"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--airhost")
    ap.add_argument("--torchrun")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json-file")
    args = ap.parse_args()
    py = Path(args.python)
    args.airhost = args.airhost or str(py.parent / "airhost")
    args.torchrun = args.torchrun or str(py.parent / "torchrun")
    root = Path(tempfile.mkdtemp(prefix="airhost-elastic-"))
    drop = ("AIRHOST_", "MLFLOW_", "TORCHELASTIC_", "PET_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and
           k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(AIRHOST_TRACKING="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", AIRHOST_STATE_DIR=str(root / "state"))
    results = {}
    kinds = ["airhost", "torchrun"]
    warm = None
    if not args.no_warm:
        warm = subprocess.Popen([args.airhost, "warm", "start", "--preload", "torch"], env=env, cwd=root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        ok = False
        for _ in range(600):
            r = subprocess.run([args.airhost, "warm", "status"], env=env, capture_output=True, text=True)
            if r.returncode == 0:
                ok = True
                break
            time.sleep(0.1)
        if ok:
            kinds.insert(1, "airhost warm")
        else:
            log("no warm server came up: airhost warm left out")
    try:
        for kind in kinds:
            log(f"{kind} ...")
            results[kind] = measure(args, kind, root, env)
    finally:
        if warm is not None:
            subprocess.run([args.airhost, "warm", "stop"], env=env, capture_output=True)
            try:
                os.killpg(warm.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            warm.wait()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    t = results["torchrun"]
    print(f"# elastic jobs, --nnodes 2:3, 3 nodes on 127.0.0.1, 1 gloo rank each — {time.strftime('%Y-%m-%d')}, "
          f"{len(os.sched_getaffinity(0))} CPUs; medians of {args.repeats} (min-max)\n")
    print("| launcher | a node dies → the rest back in a group of 2 | vs torchrun | a node comes → a group of 3 | vs torchrun |")
    print("|---|---|---|---|---|")

    def cell(r: dict, key: str) -> tuple[str, str]:
        m, fails = r[key], r["failures"][key]
        text = f"{m['median']:.2f} s ({m['min']:.2f}-{m['max']:.2f})" if m else "—"
        if fails:
            text += f", {len(fails)} of {args.repeats + 1} failed"
        ratio = f"{m['median'] / t[key]['median']:.2f}×" if m and t[key] else "—"
        return text, ratio

    for kind, r in results.items():
        (s_text, s_ratio), (g_text, g_ratio) = cell(r, "shrink_s"), cell(r, "grow_s")
        print(f"| {kind} | {s_text} | {s_ratio} | {g_text} | {g_ratio} |")
    notes = [f"- {kind}, {key[:-2]}: {why}" for kind, r in results.items() for key in ("shrink_s", "grow_s")
             for why in sorted(set(r["failures"][key]))]
    if notes:
        print("\nRuns that failed, and why (the launchers' last error line):\n" + "\n".join(notes))
    goals = []
    for kind in results:
        if kind == "torchrun":
            continue
        for key, what in (("shrink_s", "a node dies"), ("grow_s", "a node comes")):
            if not results[kind][key]:
                goals.append(f"- MISSED: {kind}, {what}: it never formed the group")
            elif not t[key]:
                goals.append(f"- held: {kind}, {what}: {results[kind][key]['median']:.2f} s, where torchrun never "
                             "formed the group")
            else:
                ratio = results[kind][key]["median"] / t[key]["median"]
                goals.append(f"- {'held' if ratio <= 0.3 else 'MISSED'}: {kind}, {what}: ≤ 0.3× torchrun "
                             f"(measured {ratio:.2f}×)")
    print("\n" + "\n".join(goals))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

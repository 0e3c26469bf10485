#!/usr/bin/env python3
"""bench/scale.py — N airhost hosts on this machine, one per node rank, as a job of N nodes.

Each host runs 1 light rank (bench/scripts/scale_rank.py: no torch) on 127.0.0.1 with one
master port; with --ddp-nodes, a gloo all_reduce too. For each N it measures what a user
feels, and when each host learned it (the host's own time stamp of its reaction, the first
line of its logs/host.log after the event):

    join      the last host started -> every rank of every node running its first line; also
              when the last host was up (its first log line) and, from there, when every host
              had learned that the job starts: start-up queued on this machine's cores, and
              the join itself, which is what a real node waits
    floor     the same number of ranks started by one host (-n N): what the ranks cost anyway
    fail      a rank of the last node exits 1 -> every host has exited, each naming it
    kill      the host of node N/2 is SIGKILLed -> every other host has exited 138 naming it
    stacks    `airhost stacks RUN --json` on node 0 -> one answer with every rank (and
              `--sample 1s`)
    restart   --max-restarts 1, one rank fails once -> every rank of the second attempt running
    cost      node 0's peak RSS, CPU seconds, open descriptors, threads; node 1's RSS and CPU

and the same (but stacks) for torchrun --rdzv-backend c10d at the N this machine can carry
(every agent imports torch: --torchrun-nodes, default 2,8,32).

    .venv/bin/python bench/scale.py                       # N = 2, 8, 32, 128, 256 (~10 min)
    .venv/bin/python bench/scale.py --nodes 2,8 --torchrun-nodes 2 --json-file scale.json

Every job is checked: each host's exit code and message, and no process of the job (found by
its SCALE_STAMPS in their environment) alive once its hosts exited. Progress on stderr, the
table on stdout; exit status 1 when a job misbehaved (its directory is kept).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "scripts" / "scale_rank.py"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` itself (a zombie's stay readable until it is reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def marked(marker: str) -> list[int]:
    """Processes whose environment holds SCALE_STAMPS=marker."""
    needle = f"SCALE_STAMPS={marker}\0".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{d}/environ").read_bytes():
                found.append(int(d))
    return found


PID_NS = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def first_child(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    return None


class Host:
    """One host (an airhost or a torchrun agent): started, watched, reaped here. With a PID
    namespace of its own (`unshare`, as a node has its own machine), `pid` is the host inside
    it, `outer` the unshare process this bench started and reaps."""

    def __init__(self, node: int, argv: list[str], env: dict, cwd: Path, watch: bool, pid_ns: bool):
        self.node, self.cwd = node, cwd
        self.out, self.err = cwd / "stdout.txt", cwd / "stderr.txt"
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.started = time.time()
            self.proc = subprocess.Popen((PID_NS if pid_ns else []) + argv, env=env, cwd=cwd, stdout=o, stderr=e,
                                         stdin=subprocess.DEVNULL)
        self.outer = self.proc.pid
        self.pid = self.outer
        if pid_ns:
            deadline = time.time() + 10
            while time.time() < deadline and (inner := first_child(self.outer)) is None:
                time.sleep(0.002)
            self.pid = inner or self.outer
        self._last_cpu: float | None = None
        self.exited: float | None = None
        self.code: int | None = None
        self.cpu: float | None = None
        self.peak = {"rss_mib": 0.0, "fds": 0, "threads": 0}
        self._stop = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()
        if watch:
            threading.Thread(target=self._sample, daemon=True).start()

    def _wait(self) -> None:
        # Not reaped at once (WNOWAIT): its CPU time is read from the zombie first (inside a
        # PID namespace the host is unshare's to reap: its last sample stands for it).
        os.waitid(os.P_PID, self.outer, os.WEXITED | os.WNOWAIT)
        self.exited = time.time()
        self.cpu = cpu_seconds(self.pid) if self.pid == self.outer else self._last_cpu
        _, status = os.waitpid(self.outer, 0)
        self.code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.code  # reaped here; Popen must not wait for it again
        self._stop.set()

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak["rss_mib"] = max(self.peak["rss_mib"], int(line.split()[1]) / 1024)
                    elif line.startswith("Threads:"):
                        self.peak["threads"] = max(self.peak["threads"], int(line.split()[1]))
                self.peak["fds"] = max(self.peak["fds"], len(os.listdir(f"/proc/{self.pid}/fd")))
                if (cpu := cpu_seconds(self.pid)) is not None:
                    self._last_cpu = cpu
            self._stop.wait(0.05)

    def text(self) -> str:
        return self.err.read_text(errors="replace") + self.out.read_text(errors="replace")

    def host_log_times(self) -> list[tuple[float, str]]:
        """airhost's logs/host.log: (time, line) for each line."""
        logs = list(self.cwd.glob("runs/*/logs/host.log"))
        if not logs:
            return []
        out = []
        for line in logs[0].read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                t = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
                out.append((t.timestamp(), line[24:]))
        return out

    def learned(self, since: float, words: tuple[str, ...] = ()) -> float | None:
        """When this host first said something at or after `since` (containing one of `words`)."""
        for t, line in self.host_log_times():
            if t >= since - 0.001 and (not words or any(w in line for w in words)):
                return t
        return None

    def stop(self) -> None:
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.outer, signal.SIGKILL)


class Job:
    """N hosts of one job, node 0 first, each with its own directory (cwd, runs root, output)."""

    def __init__(self, b: "Bench", kind: str, n: int, tag: str, script_args: list[str], flags: list[str] = (),
                 ranks_per_host: int = 1, single: bool = False):
        self.b, self.kind, self.n, self.tag = b, kind, n, tag
        self.dir = Path(tempfile.mkdtemp(prefix=f"{kind}-{tag}-{n}-", dir=b.root))
        self.stamps = self.dir / "stamps"
        self.stamps.mkdir()
        self.nranks = (1 if single else n) * ranks_per_host
        port = free_port()
        env = dict(b.env, SCALE_STAMPS=str(self.stamps))
        self.hosts: list[Host] = []
        for node in range(1 if single else n):
            cwd = self.dir / f"node-{node}"
            cwd.mkdir()
            henv = dict(env, AIRHOST_RUNS_DIR=str(cwd / "runs"))
            if kind == "airhost":
                argv = [b.airhost, str(RANK_SCRIPT), "-n", str(ranks_per_host), "--grace", "2", *flags]
                if not single:
                    argv += ["--nnodes", str(n), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), "--node-timeout", "10", "--join-timeout", "600"]
                argv += ["--", *script_args] if script_args else []
            else:
                argv = [b.torchrun, "--nnodes", str(n), "--nproc-per-node", str(ranks_per_host),
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "scale",
                        "--rdzv-conf", "join_timeout=600", *flags, str(RANK_SCRIPT), *script_args]
            # torchrun's agents stay in this machine's PID namespace: in namespaces of their own
            # they are all PID 1 on one host name, which its rendezvous takes for one node.
            self.hosts.append(Host(node, argv, henv, cwd, watch=node < 2, pid_ns=b.args.pid_ns and kind == "airhost"))
        self.last_started = self.hosts[-1].started

    def stamp_times(self, prefix: str) -> list[float]:
        out = []
        for p in self.stamps.glob(prefix + "*"):
            if p.name.endswith(".tmp"):
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(float(p.read_text()))
        return out

    def wait_for(self, what, timeout: float, describe: str):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = what()
            if got:
                return got
            if any(h.code is not None for h in self.hosts) and describe.startswith("every rank"):
                break  # a host ended before its ranks ran: the job failed
            time.sleep(0.01)
        return None

    def running(self, after: float = 0, timeout: float = 300) -> float | None:
        """When every rank ran its first line after `after` (the last stamp), or None. A rank
        started again overwrites its stamp (torchrun's agents count a restart for the node that
        failed only, so the attempt in the name is not the job's)."""
        got = self.wait_for(lambda: (t := [x for x in self.stamp_times("start-") if x > after]) and
                            len(t) >= self.nranks and t, timeout, "every rank running")
        return max(got) if got else None

    def all_exited(self, hosts=None, timeout: float = 60) -> float | None:
        hosts = self.hosts if hosts is None else hosts
        ok = self.wait_for(lambda: all(h.code is not None for h in hosts), timeout, "every host exited")
        return max(h.exited for h in hosts) if ok else None

    def touch(self, name: str) -> float:
        t = time.time()
        (self.stamps / name).write_text("")
        return t

    def run_id(self) -> str | None:
        runs = [p.name for p in (self.hosts[0].cwd / "runs").glob("*") if (p / "run.json").exists()]
        return runs[0] if runs else None

    def finish(self, problems: list[str], row: dict | None = None) -> None:
        """Every host stopped and reaped, and no process of the job left (checked, then killed)."""
        for h in self.hosts:
            h.stop()
        self.all_exited(timeout=30)
        deadline = time.time() + 5
        left = marked(str(self.stamps))
        while left and time.time() < deadline:
            time.sleep(0.1)
            left = marked(str(self.stamps))
        if left and self.kind == "torchrun" and row is not None:
            # torchrun's own behaviour, measured: a worker whose agent was SIGKILLed lives on.
            row[f"{self.tag}_leftover_note"] = (f"{len(left)} process(es) outlived their torchrun agents "
                                                f"({self.tag} job; killed by the bench)")
        elif left:
            problems.append(f"{self.kind} N={self.n}: {len(left)} process(es) of the job alive 5 s after its hosts "
                            f"exited (pids {left[:8]}); killed")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if not problems or not self.b.args.keep_failed:
            if not self.b.args.keep:
                shutil.rmtree(self.dir, ignore_errors=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="airhost-scale-"))
        py = Path(args.python)
        self.airhost = args.airhost or str(py.parent / "airhost")
        self.torchrun = args.torchrun or str(py.parent / "torchrun")
        drop = ("AIRHOST_", "MLFLOW_", "TORCHELASTIC_", "PET_", "SLURM_")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(drop) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        self.env.update(AIRHOST_TRACKING="0", OMP_NUM_THREADS="1", TMPDIR=str(self.root), PYTHONUNBUFFERED="1")
        self.problems: list[str] = []


def s(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def measure_main(b: Bench, kind: str, n: int) -> dict:
    """join, (stacks,) fail and the hosts' cost in one job."""
    fail_rank = n - 1
    job = Job(b, kind, n, "fail", ["--fail-rank", str(fail_rank)])
    r: dict = {}
    try:
        running = job.running()
        if running is None:
            b.problems.append(f"{kind} N={n}: the ranks never all ran ({job.dir})")
            return r
        r["join_s"] = s(running - job.last_started)
        # At rest: what node 0 costs a second while every rank runs and nothing happens
        # (heartbeats, the watches), over --rest seconds.
        before = cpu_seconds(job.hosts[0].pid)
        time.sleep(b.args.rest)
        after = cpu_seconds(job.hosts[0].pid)
        if before is not None and after is not None:
            r["node0_rest_cpu_pct"] = s(100 * (after - before) / b.args.rest)
        if kind == "airhost":
            heard = [h.learned(job.hosts[0].started, ("nodes joined",)) for h in job.hosts]
            r["join_learned_s"] = s(max(heard) - job.last_started) if all(heard) else None
            # When the last host was up (its first line: connected to node 0, or node 0
            # listening): what start-up costs on this machine's cores before the join begins,
            # and the join itself from there, which is what a node of a real cluster waits.
            up = [h.learned(job.hosts[0].started) for h in job.hosts]
            if all(up) and all(heard):
                r["last_up_s"] = s(max(up) - job.last_started)
                r["join_learned_after_up_s"] = s(max(heard) - max(up))
                # The first host to learn it: node 0's decision and its first welcome. The
                # spread from there to the last is the welcomes going out while the hosts that
                # had theirs start their ranks on the same cores.
                r["join_first_learned_after_up_s"] = s(min(heard) - max(up))
        if kind == "airhost" and not b.args.no_stacks:
            run_id = job.run_id()
            env = dict(b.env, AIRHOST_RUNS_DIR=str(job.hosts[0].cwd / "runs"))
            for key, extra in (("stacks_s", []), ("stacks_sample_1s_s", ["--sample", "1s"])):
                t0 = time.time()
                # Asked on node 0's machine: inside its PID namespace, where its host is the run's.
                enter = (["nsenter", "--target", str(job.hosts[0].pid), "--pid", "--mount"]
                         if job.hosts[0].pid != job.hosts[0].outer else [])
                got = subprocess.run([*enter, b.airhost, "stacks", run_id, "--json", *extra], env=env,
                                     capture_output=True, text=True, timeout=120)
                took = time.time() - t0
                try:
                    answer = json.loads(got.stdout)
                    ranks = answer.get("ranks", [])
                    answered = sum(1 for x in ranks if x.get("answered"))
                except ValueError:
                    answered = 0
                    b.problems.append(f"airhost N={n}: stacks {extra}: not JSON: {got.stdout[-300:]}{got.stderr[-300:]}")
                if answered < n:
                    b.problems.append(f"airhost N={n}: stacks {extra} answered for {answered} of {n} ranks")
                r[key] = s(took)
                r[key[:-2] + "_answered"] = answered
        job.touch("go")
        failed = job.wait_for(lambda: job.stamp_times("fail-"), 30, "the rank failing")
        exited = job.all_exited(timeout=b.args.event_timeout)
        if failed and exited:
            r["fail_s"] = s(exited - failed[0])
            if kind == "airhost":
                heard = [h.learned(failed[0], ("stopping the ranks",)) for h in job.hosts]
                r["fail_learned_s"] = s(max(heard) - failed[0]) if all(heard) else None
                unnamed = [h.node for h in job.hosts if f"rank {fail_rank}" not in h.text()]
                if unnamed:
                    b.problems.append(f"airhost N={n}: {len(unnamed)} host(s) did not name rank {fail_rank} "
                                      f"(nodes {unnamed[:8]})")
                # The failing rank's node exits 1; every other node 138, its ranks stopped for it.
                wrong = sorted({(h.node, h.code) for h in job.hosts if h.code != (1 if h.node == n - 1 else 138)})
                if wrong:
                    b.problems.append(f"airhost N={n}: after rank {fail_rank} failed, (node, exit code) {wrong[:8]}: "
                                      f"expected 1 on node {n - 1} and 138 elsewhere")
        else:
            r["fail_s"] = None
            left = sum(h.code is None for h in job.hosts)
            r["fail_note"] = (f"{left} of {n} hosts had not exited {b.args.event_timeout:.0f} s after the failure" +
                              (" (torchrun's other agents wait for their own ranks: one that is not in a collective "
                               "when a peer fails goes on)" if kind == "torchrun" else ""))
        for i, key in ((0, "node0"), (1, "node1")):
            if i < len(job.hosts):
                h = job.hosts[i]
                r[f"{key}_rss_mib"] = s(h.peak["rss_mib"])
                r[f"{key}_cpu_s"] = s(h.cpu)
                if i == 0:
                    r["node0_fds"] = h.peak["fds"]
                    r["node0_threads"] = h.peak["threads"]
        return r
    finally:
        job.finish(b.problems, r)


def measure_kill(b: Bench, kind: str, n: int) -> dict:
    victim = n // 2 if n > 2 else 1
    job = Job(b, kind, n, "kill", [])
    r: dict = {}
    try:
        if job.running() is None:
            b.problems.append(f"{kind} N={n}: the ranks never all ran ({job.dir})")
            return r
        killed = time.time()
        os.kill(job.hosts[victim].pid, signal.SIGKILL)
        others = [h for h in job.hosts if h.node != victim]
        exited = job.all_exited(others, timeout=b.args.event_timeout)
        if exited is None:
            r["kill_note"] = f"not every other host exited within {b.args.event_timeout:.0f} s"
            return r
        r["kill_s"] = s(exited - killed)
        if kind == "airhost":
            heard = [h.learned(killed, ("stopping the ranks",)) for h in others]
            r["kill_learned_s"] = s(max(heard) - killed) if all(heard) else None
            wrong = sorted({h.code for h in others if h.code != 138})
            if wrong:
                b.problems.append(f"airhost N={n}: other hosts exited {wrong} after node {victim} was killed, not 138")
            unnamed = [h.node for h in others if f"node {victim}" not in h.text()]
            if unnamed:
                b.problems.append(f"airhost N={n}: {len(unnamed)} host(s) did not name node {victim} (nodes {unnamed[:8]})")
        return r
    finally:
        job.finish(b.problems, r)


def measure_restart(b: Bench, kind: str, n: int) -> dict:
    job = Job(b, kind, n, "restart", ["--fail-rank", str(n - 1), "--fail-once"], ["--max-restarts", "1"])
    r: dict = {}
    try:
        if job.running() is None:
            b.problems.append(f"{kind} N={n}: the ranks never all ran ({job.dir})")
            return r
        job.touch("go")
        failed = job.wait_for(lambda: job.stamp_times("fail-"), 30, "the rank failing")
        again = job.running(after=failed[0], timeout=b.args.event_timeout) if failed else None
        if failed and again:
            r["restart_s"] = s(again - failed[0])
        else:
            r["restart_note"] = f"the second attempt was not running within {b.args.event_timeout:.0f} s"
        job.touch("done")
        exited = job.all_exited(timeout=60)
        if exited is None or any(h.code != 0 for h in job.hosts):
            b.problems.append(f"{kind} N={n}: after the restart, hosts exited {sorted({h.code for h in job.hosts})}")
        return r
    finally:
        job.finish(b.problems, r)


def measure_floor(b: Bench, n: int) -> dict:
    job = Job(b, "airhost", n, "floor", [], ranks_per_host=n, single=True)
    r: dict = {}
    try:
        running = job.running()
        job.touch("done")
        job.all_exited(timeout=60)
        r["floor_s"] = s(running - job.hosts[0].started) if running else None
        return r
    finally:
        job.finish(b.problems, r)


def measure_ddp(b: Bench, kind: str, n: int) -> dict:
    job = Job(b, kind, n, "ddp", ["--ddp"])
    r: dict = {}
    try:
        running = job.running(timeout=300)
        job.touch("done")
        job.all_exited(timeout=120)
        bad = sorted({h.code for h in job.hosts if h.code != 0})
        if running is None or bad:
            b.problems.append(f"{kind} N={n}: the gloo all_reduce job failed (exit codes {bad}, {job.dir})")
        r["ddp_join_s"] = s(running - job.last_started) if running else None
        return r
    finally:
        job.finish(b.problems, r)


def fmt(v, unit="") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.2f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{v}{unit}"


def print_report(rep: dict) -> None:
    m = rep["machine"]
    print(f"# airhost at scale — {rep['date']}, {m['cpus']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, "
          f"airhost {m['airhost']}, torch {m['torch']}")
    print()
    print("One light rank per host on 127.0.0.1 (no torch), each host in a PID namespace of its own" if rep["pid_ns"] else
          "One light rank per host on 127.0.0.1 (no torch), all hosts in one PID namespace")
    print("(a node's own /proc); seconds, wall clock. \"learned\": the last host's own")
    print("time stamp of its reaction (logs/host.log). floor: the same ranks started by one host (-n N).")
    print()
    cols = [("N", "n", ""), ("join", "join_s", ""), ("learned", "join_learned_s", ""), ("last host up", "last_up_s", ""), ("first learned after up", "join_first_learned_after_up_s", ""), ("last learned after up", "join_learned_after_up_s", ""), ("floor", "floor_s", ""),
            ("join/floor", "join_over_floor", "×"), ("join, gloo all_reduce", "ddp_join_s", ""), ("fail→all out", "fail_s", ""), ("learned", "fail_learned_s", ""),
            ("kill→all out", "kill_s", ""), ("learned", "kill_learned_s", ""), ("stacks", "stacks_s", ""),
            ("sample 1s", "stacks_sample_1s_s", ""), ("restart", "restart_s", ""),
            ("node 0 at rest % CPU", "node0_rest_cpu_pct", ""), ("node 0 RSS MiB", "node0_rss_mib", ""), ("node 0 CPU s", "node0_cpu_s", ""), ("fds", "node0_fds", ""),
            ("threads", "node0_threads", ""), ("node 1 RSS", "node1_rss_mib", ""), ("node 1 CPU s", "node1_cpu_s", "")]
    for kind in ("airhost", "torchrun"):
        rows = rep[kind]
        if not rows:
            continue
        used = [c for c in cols if any(r.get(c[1]) is not None for r in rows)]
        print(f"## {kind}" + ("" if kind == "airhost" else " (--rdzv-backend c10d; no stacks command)"))
        print()
        print("| " + " | ".join(c[0] for c in used) + " |")
        print("|" + "---|" * len(used))
        for r in rows:
            print("| " + " | ".join(fmt(r.get(c[1]), c[2]) for c in used) + " |")
        notes = [f"N={r['n']}: {r[k]}" for r in rows for k in sorted(r) if k.endswith("_note")]
        for note in notes:
            print(f"- {note}")
        print()
    ratios = rep.get("per_host_cpu_ratio")
    if ratios:
        print("A host's CPU seconds over the job (node 1), torchrun agent / airhost host: " +
              ", ".join(f"N={n}: {v:.0f}×" for n, v in ratios.items()))
        print()
    if rep["goals"]:
        print("## Goals at the largest N")
        print()
        for g in rep["goals"]:
            print(f"- {'held' if g['held'] else 'MISSED'}: {g['goal']} (measured {g['value']})")
        print()
    if rep["problems"]:
        print("## Problems")
        for p in rep["problems"]:
            print(f"- {p}")


def goals(rep: dict) -> list[dict]:
    rows = rep["airhost"]
    if not rows:
        return []
    r = rows[-1]
    out = []

    def goal(text, value, held):
        out.append({"goal": f"N={r['n']}: {text}", "value": value, "held": bool(held)})

    if r.get("join_learned_s") is not None:
        goal("every host learns the job starts ≤ 0.5 s after the last host starts", f"{r['join_learned_s']} s",
             r["join_learned_s"] <= 0.5)
    if r.get("join_learned_after_up_s") is not None:
        goal("every host learns the job starts ≤ 0.5 s after the last host is up (its first line)",
             f"{r['join_learned_after_up_s']} s", r["join_learned_after_up_s"] <= 0.5)
    if r.get("fail_learned_s") is not None:
        goal("every host learns a rank failed ≤ 0.5 s after it did", f"{r['fail_learned_s']} s", r["fail_learned_s"] <= 0.5)
    if r.get("kill_learned_s") is not None:
        goal("every host learns a host died ≤ 0.5 s after it did", f"{r['kill_learned_s']} s", r["kill_learned_s"] <= 0.5)
    if r.get("join_over_floor") is not None:
        goal("every rank running within 1.2× the floor", f"{r['join_over_floor']}×", r["join_over_floor"] <= 1.2)
    if r.get("stacks_s") is not None:
        goal("stacks of all ranks ≤ 2 s", f"{r['stacks_s']} s", r["stacks_s"] <= 2)
    if r.get("node0_rss_mib") is not None:
        goal("node 0 ≤ 64 MiB RSS", f"{r['node0_rss_mib']} MiB", r["node0_rss_mib"] <= 64)
    ratios = rep.get("per_host_cpu_ratio")
    if ratios:
        worst = min(ratios.values())
        goal("each host's CPU at least 20× below a torchrun agent's", f"{worst:.0f}× at worst", worst >= 20)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="2,8,32,128,256")
    ap.add_argument("--torchrun-nodes", default="2,8,32", help="'' for none")
    ap.add_argument("--ddp-nodes", default="2,8", help="N for which a gloo all_reduce job is timed too ('' for none)")
    ap.add_argument("--only", default="main,kill,restart,floor,ddp")
    ap.add_argument("--event-timeout", type=float, default=60, help="how long a failure may take to end a job")
    ap.add_argument("--no-stacks", action="store_true", help="leave out the stacks requests")
    ap.add_argument("--no-pid-ns", dest="pid_ns", action="store_false",
                    help="run the hosts in this machine's PID namespace: each then sweeps every host's processes "
                         "(a host looks through /proc for what left its ranks' groups), which no real node does")
    ap.add_argument("--rest", type=float, default=5, help="seconds node 0's CPU is measured at rest")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--airhost")
    ap.add_argument("--torchrun")
    ap.add_argument("--json-file")
    ap.add_argument("--keep", action="store_true", help="keep every job's directory")
    ap.add_argument("--keep-failed", action="store_true", default=True, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pid_ns and (os.geteuid() != 0 or not shutil.which("unshare")):
        log("no PID namespaces (needs root and unshare): every host sweeps every host's processes")
        args.pid_ns = False
    b = Bench(args)
    only = set(args.only.split(","))
    nums = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
    soft = os.sysconf("SC_OPEN_MAX")
    torch_version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True).stdout.strip() or "?"
    rep = {"date": time.strftime("%Y-%m-%d"), "machine": {
        "cpus": len(os.sched_getaffinity(0)), "kernel": platform.release(), "open_max": soft,
        "cpu_model": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                           if line.startswith("model name")), "?"),
        "airhost": subprocess.run([b.airhost, "--version"], capture_output=True, text=True).stdout.strip(),
        "torch": torch_version}, "pid_ns": args.pid_ns, "airhost": [], "torchrun": [], "problems": b.problems}
    for kind, ns in (("airhost", nums(args.nodes)), ("torchrun", nums(args.torchrun_nodes))):
        if kind == "torchrun" and not Path(b.torchrun).exists():
            b.problems.append(f"no torchrun at {b.torchrun}: its rows are left out")
            continue
        for n in ns:
            row: dict = {"n": n}
            log(f"{kind}: N={n}")
            if "main" in only:
                row.update(measure_main(b, kind, n))
            if "kill" in only:
                row.update(measure_kill(b, kind, n))
            if "restart" in only:
                row.update(measure_restart(b, kind, n))
            if kind == "airhost" and "floor" in only:
                row.update(measure_floor(b, n))
                if row.get("join_s") and row.get("floor_s"):
                    row["join_over_floor"] = s(row["join_s"] / row["floor_s"])
            if "ddp" in only and n in nums(args.ddp_nodes):
                row.update(measure_ddp(b, kind, n))
            log(f"{kind}: N={n}: {json.dumps(row)}")
            rep[kind].append(row)
    ratios = {}
    for t in rep["torchrun"]:
        a = next((r for r in rep["airhost"] if r["n"] == t["n"]), None)
        if a and a.get("node1_cpu_s") and t.get("node1_cpu_s"):
            ratios[t["n"]] = t["node1_cpu_s"] / a["node1_cpu_s"]
    rep["per_host_cpu_ratio"] = ratios
    rep["goals"] = goals(rep)
    print_report(rep)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rep, indent=1))
    if not args.keep and not b.problems:
        shutil.rmtree(b.root, ignore_errors=True)
    elif b.problems:
        log(f"kept {b.root}")
    return 1 if b.problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench/guard.py — the performance guard CI runs (scripts/test.sh, last): small versions of
the benchmarks, each against its peer or floor measured in the same run, failing when a figure
is several times worse than its stated bound.

    .venv/bin/python bench/guard.py                  # every check, ~1.5 min on 2 cores
    .venv/bin/python bench/guard.py --only fail8 --rounds 5 --json-file guard.json

Checks (bench/README.md says how the full benchmarks take the same figures):

  fail8     8 airhosts on 127.0.0.1 (1 light rank each, --grace 30): the last rank exits 1 ->
            every host has exited, against one host tearing down 8 such ranks (the floor).
            Stated bound (docs/multinode.md): <= 1.2 x floor + 0.5 s
  startup   airhost cold, 2 ranks, launch -> the last rank's line after `import torch`,
            against torchrun. Stated bound: <= 0.7 x torchrun
  warm3     the Python API's 3rd `.distributed()` call of a process (its warm server forks the
            ranks) -> the last rank past `import torch`, against the same process's 1st,
            cold, call. Stated bound: <= 0.1 x the cold call
  results   4 ranks x 64 MiB returned through `.distributed()`, GB/s into the caller, against
            memcpy. Stated bound: >= 0.5 x memcpy
  recovery  2 nodes x 2 ranks (gloo), --max-restarts 1: SIGKILL of a rank -> every rank of the
            next attempt back in the group, against the first attempt's launch -> every rank
            in the group (a recovery is a cold start plus the teardown). Stated: <= 1.5 x

Each check runs --rounds rounds (3), airhost and its peer alternating, after one uncounted
warm-up; the figure is the ratio of the medians. The guard fails a check only past --slack
times its stated bound (3x; 2x for the ratios against a peer that starts the same processes),
wide enough for a loaded 2-core machine, tight enough that a wait of seconds where there should
be none (a host waiting out a grace period: 25x the bound) fails it. It is not a benchmark:
bench/launch.py and bench/scale.py are, with more rounds and every peer. Exit status 1 when a
check fails or a run misbehaves (wrong exit code, a process left behind), with what it saw.
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
SCRIPTS = HERE / "scripts"
CHECKS = ("fail8", "startup", "warm3", "results", "recovery")


class GuardError(Exception):
    """A run misbehaved: the message says which and how."""


def log(msg: str) -> None:
    print(f"[guard {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} unreadable)"


class Guard:
    def __init__(self, args):
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="airhost-guard-"))
        self.count = 0
        bindir = Path(args.python).parent
        self.airhost = os.path.abspath(args.airhost) if args.airhost else str(bindir / "airhost")
        self.torchrun = str(bindir / "torchrun")

    def env(self, stamps: Path, runs: Path) -> dict:
        env = dict(os.environ)
        env.update({"AIRHOST_BENCH_STAMPS": str(stamps), "SCALE_STAMPS": str(stamps),
                    "AIRHOST_RUNS_DIR": str(runs), "AIRHOST_STATE_DIR": str(runs / "state"),
                    "AIRHOST_TRACKING": "0", "PYTHONPATH": str(SCRIPTS), "OMP_NUM_THREADS": "1"})
        env.pop("AIRHOST_RANK_BINARY", None)
        return env

    def workdir(self, name: str) -> tuple[Path, Path, Path]:
        self.count += 1
        d = self.root / f"{self.count:03d}-{name}"
        stamps, runs = d / "stamps", d / "runs"
        stamps.mkdir(parents=True)
        runs.mkdir()
        return d, stamps, runs

    def left_behind(self, stamps: Path) -> list[int]:
        """Processes whose environment names this run's stamps directory, still running."""
        mark = f"SCALE_STAMPS={stamps}".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{name}/environ").read_bytes()
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if mark in environ.split(b"\0") and state not in ("Z", "X"):
                found.append(int(name))
        return found

    def settle(self, what: str, stamps: Path) -> None:
        deadline = time.monotonic() + 5
        while (left := self.left_behind(stamps)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise GuardError(f"{what}: processes {left} outlived their launcher")

    def wait_files(self, what: str, paths: list[Path], procs: list[subprocess.Popen], logs: list[Path],
                   timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise GuardError(f"{what}: did not get going\n" + "\n".join(tail(log) for log in logs))
            time.sleep(0.01)

    def kill_all(self, procs: list[subprocess.Popen]) -> None:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    # ------------------------------------------------------------------ the runs

    def teardown(self, hosts: int, ranks: int = 8) -> float:
        """A job of `hosts` airhosts (1 light rank each), or one airhost of `ranks` ranks when
        hosts == 1: the last rank exits 1 on a cue -> the seconds until every host exited."""
        if hosts > 1:
            ranks = hosts
        d, stamps, runs = self.workdir(f"fail-{hosts}")
        env = self.env(stamps, runs)
        port = free_port()
        common = ["--grace", "30", "--", "--fail-rank", str(ranks - 1)]
        script = str(SCRIPTS / "scale_rank.py")
        if hosts == 1:
            argvs = [[self.airhost, script, "-n", str(ranks), *common]]
        else:
            argvs = [[self.airhost, script, "-n", "1", "--nnodes", str(hosts), "--node-rank", str(k),
                      "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-timeout", "30",
                      "--join-timeout", "60", *common] for k in range(hosts)]
        logs = [d / f"host{k}.log" for k in range(len(argvs))]
        files = [open(log_, "wb") for log_ in logs]
        procs = [subprocess.Popen(a, cwd=d, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
                 for a, f in zip(argvs, files)]
        try:
            self.wait_files(f"{hosts} host(s)", [stamps / f"start-0-{r}" for r in range(ranks)], procs, logs)
            t0 = time.monotonic()
            (stamps / "go").touch()
            ended = [None] * len(procs)
            while None in ended and time.monotonic() - t0 < 120:
                for k, p in enumerate(procs):
                    if ended[k] is None and p.poll() is not None:
                        ended[k] = time.monotonic() - t0
                time.sleep(0.002)
        finally:
            self.kill_all(procs)
            for f in files:
                f.close()
        want = [1] if hosts == 1 else [138] * (hosts - 1) + [1]
        got = [p.returncode for p in procs]
        if got != want or None in ended:
            raise GuardError(f"{hosts} host(s): exit codes {got}, expected {want}\n" +
                             "\n".join(tail(log_) for log_ in logs))
        self.settle(f"{hosts} host(s)", stamps)
        return max(ended)

    def startup(self, launcher: str) -> float:
        """Launch -> the last of 2 ranks past `import torch`, cold."""
        d, stamps, runs = self.workdir(f"startup-{launcher}")
        env = self.env(stamps, runs)
        script = str(SCRIPTS / "startup.py")
        argv = ([self.airhost, script, "-n", "2", "--cold"] if launcher == "airhost"
                else [self.torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), script])
        t0 = time.time()
        done = subprocess.run(argv, cwd=d, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=self.args.timeout)
        if done.returncode != 0:
            raise GuardError(f"startup under {launcher}: exit {done.returncode}\n{done.stderr.decode()[-3000:]}")
        stamps_t = [json.loads((stamps / f"torch.{r}").read_text())["t"] for r in range(2)]
        self.settle(f"startup under {launcher}", stamps)
        return max(stamps_t) - t0

    def warm3(self) -> tuple[float, float]:
        """(the 3rd call -> last rank past import torch, the 1st, cold, call) of one process."""
        d, stamps, runs = self.workdir("warm3")
        env = self.env(stamps, runs)
        done = subprocess.run([self.args.python, str(SCRIPTS / "api_caller.py"), "2"], cwd=d, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=self.args.timeout)
        if done.returncode != 0:
            raise GuardError(f"warm calls: exit {done.returncode}\n{done.stderr.decode()[-3000:]}")
        got = json.loads(done.stdout.decode().strip().splitlines()[-1])
        self.settle("warm calls", stamps)
        return got["ready"], got["first_call"]

    def results(self, mode: str) -> float:
        """GB/s: 4 ranks x 64 MiB into the caller (airhost), or one 64 MiB memcpy."""
        d, stamps, runs = self.workdir(f"results-{mode}")
        env = self.env(stamps, runs)
        ranks = "4" if mode == "airhost" else "1"
        mib = self.args.result_mib
        done = subprocess.run([self.args.python, str(SCRIPTS / "results_caller.py"), mode, ranks, str(mib)], cwd=d,
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=self.args.timeout)
        if done.returncode != 0:
            raise GuardError(f"results via {mode}: exit {done.returncode}\n{done.stderr.decode()[-3000:]}")
        got = json.loads(done.stdout.decode().strip().splitlines()[-1])
        self.settle(f"results via {mode}", stamps)
        return got["bytes"] / got["window"] / 1e9

    def recovery(self) -> tuple[float, float]:
        """(SIGKILL of a rank -> every rank of the next attempt in the group, launch -> every
        rank of the first attempt in the group), 2 nodes x 2 ranks, cold."""
        d, stamps, runs = self.workdir("recovery")
        env = self.env(stamps, runs)
        port = free_port()
        argvs = [[self.airhost, str(SCRIPTS / "recover.py"), "-n", "2", "--nnodes", "2", "--node-rank", str(k),
                  "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "1", "--grace", "30",
                  "--cold"] for k in (0, 1)]
        logs = [d / f"node{k}.log" for k in (0, 1)]
        files = [open(log_, "wb") for log_ in logs]
        t_launch = time.time()
        procs = [subprocess.Popen(a, cwd=d, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
                 for a, f in zip(argvs, files)]
        try:
            self.wait_files("recovery", [stamps / "victim"] + [stamps / f"ready0.{r}" for r in range(4)], procs, logs)
            (stamps / "killed").touch()
            t_kill = time.time()
            os.kill(int((stamps / "victim").read_text()), signal.SIGKILL)
            rcs = [p.wait(timeout=self.args.timeout) for p in procs]
        finally:
            self.kill_all(procs)
            for f in files:
                f.close()
        if rcs != [0, 0]:
            raise GuardError(f"recovery: exit codes {rcs}, expected [0, 0]\n" + "\n".join(tail(log_) for log_ in logs))
        ready = lambda attempt: max(json.loads((stamps / f"ready{attempt}.{r}").read_text())["t"]  # noqa: E731
                                    for r in range(4))
        self.settle("recovery", stamps)
        return ready(1) - t_kill, ready(0) - t_launch


def collect(g: Guard, name: str, one_round) -> tuple[list[float], list[float]]:
    """One uncounted warm-up round, then --rounds rounds of `one_round(i)` -> (airhost, peer)."""
    a, b = [], []
    for i in range(1 + g.args.rounds):
        x, y = one_round(i)
        if i:
            a.append(x)
            b.append(y)
            log(f"  {name} {i}/{g.args.rounds}: {x:.3f} / {y:.3f}")
    return a, b


def alternating(measure_a, measure_b):
    """A round that runs both measures, the one that goes first alternating from round to round."""
    def one_round(i):
        if i % 2 == 0:
            return measure_a(), measure_b()
        y = measure_b()
        return measure_a(), y
    return one_round


def row(what: str, runs: list[float], peer_runs: list[float], unit: str, peer_what: str, bound: str,
        stated: float, slack: float, higher_is_worse: bool = True, against=None) -> dict:
    """A check's figures: the medians, their ratio (against `against(peer)` when the bound is not
    a plain multiple of the peer) and the guard's limit, `slack` times the stated bound."""
    figure, peer = statistics.median(runs), statistics.median(peer_runs)
    return {"what": what, "figure": figure, "unit": unit, "peer": peer, "peer_what": peer_what,
            "ratio": figure / (against(peer) if against else peer), "bound": bound, "stated": stated,
            "limit": stated * slack if higher_is_worse else stated / slack, "higher_is_worse": higher_is_worse,
            "runs": runs, "peer_runs": peer_runs}


def check_fail8(g: Guard) -> dict:
    hosts, floor = collect(g, "fail8 (8 hosts / one host)", alternating(lambda: g.teardown(8), lambda: g.teardown(1)))
    return row("a rank fails -> all 8 hosts out", hosts, floor, "s", "one host's teardown of 8 ranks",
               "<= 1.2 x floor + 0.5 s", 1.0, 3.0, against=lambda floor: 1.2 * floor + 0.5)


def check_startup(g: Guard) -> dict:
    a, t = collect(g, "startup (airhost / torchrun)", alternating(lambda: g.startup("airhost"), lambda: g.startup("torchrun")))
    return row("cold start, 2 ranks, to the line after import torch", a, t, "s", "torchrun", "<= 0.7 x torchrun",
               0.7, 2.0)


def check_warm3(g: Guard) -> dict:
    third, first = collect(g, "warm3 (3rd call / 1st, cold, call)", lambda i: g.warm3())
    return row("Python API, 3rd call -> last rank past import torch, 2 ranks", third, first, "s",
               "the same process's 1st (cold) call", "<= 0.1 x the cold call", 0.1, 3.0)


def check_results(g: Guard) -> dict:
    a, m = collect(g, "results (airhost / memcpy, GB/s)", alternating(lambda: g.results("airhost"), lambda: g.results("memcpy")))
    return row(f"results, 4 ranks x {g.args.result_mib} MiB into the caller", a, m, "GB/s", "memcpy",
               ">= 0.5 x memcpy", 0.5, 3.0, higher_is_worse=False)


def check_recovery(g: Guard) -> dict:
    rec, cold = collect(g, "recovery (after the kill / first attempt)", lambda i: g.recovery())
    return row("SIGKILL of a rank -> every rank back in the group, 2 nodes x 2 ranks", rec, cold, "s",
               "the first attempt, launch -> in the group", "<= 1.5 x the first attempt", 1.5, 3.0)


def verdict(c: dict) -> bool:
    return c["ratio"] <= c["limit"] if c["higher_is_worse"] else c["ratio"] >= c["limit"]


def print_table(report: dict) -> None:
    m = report["machine"]
    print(f"airhost performance guard, {report['date']}, {m['cpus']} CPUs, load {m['load']:.1f}, "
          f"{report['rounds']} rounds (medians)")
    print(f"{'check':<9} {'airhost':>10} {'peer/floor':>11} {'ratio':>7} {'stated':>26} {'fails past':>10}  verdict")
    for name, c in report["checks"].items():
        if "error" in c:
            print(f"{name:<9} {'-':>10} {'-':>11} {'-':>7} {'':>26} {'':>10}  ERROR: {c['error'].splitlines()[0]}")
            continue
        op = ">" if c["higher_is_worse"] else "<"
        print(f"{name:<9} {c['figure']:>8.3f}{c['unit'] if c['unit'] == 's' else '':<2} {c['peer']:>9.3f}"
              f"{c['unit'] if c['unit'] == 's' else '':<2} {c['ratio']:>6.2f}x {c['bound']:>26} {op + format(c['limit'], '.2f') + 'x':>10}"
              f"  {'ok' if c['ok'] else 'FAIL'}")
    for name, c in report["checks"].items():
        if "error" not in c:
            print(f"  {name}: {c['what']}; peer: {c['peer_what']}"
                  + (f" ({c['unit']})" if c["unit"] != "s" else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CHECKS), help=f"comma list of {', '.join(CHECKS)}")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per check (default 3)")
    ap.add_argument("--result-mib", type=int, default=64, help="MiB per rank in the results check (default 64)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per run")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--airhost", help="the airhost to guard (default: beside --python)")
    ap.add_argument("--json-file")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args()
    only = [c for c in args.only.split(",") if c]
    if bad := [c for c in only if c not in CHECKS]:
        ap.error(f"unknown check {bad[0]!r}: choose among {', '.join(CHECKS)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    g = Guard(args)
    for tool in (g.airhost, g.torchrun):
        if not os.access(tool, os.X_OK):
            log(f"{tool} is missing: run scripts/setup.sh first (or pass --python/--airhost)")
            return 2
    fns = {"fail8": check_fail8, "startup": check_startup, "warm3": check_warm3, "results": check_results,
           "recovery": check_recovery}
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "rounds": args.rounds,
              "machine": {"cpus": len(os.sched_getaffinity(0)), "load": os.getloadavg()[0]}, "checks": {}}
    t_all = time.monotonic()
    for name in only:
        t0 = time.monotonic()
        log(f"{name}")
        try:
            c = fns[name](g)
            c["ok"] = verdict(c)
        except (GuardError, subprocess.TimeoutExpired) as e:
            c = {"error": str(e), "ok": False}
        c["seconds"] = time.monotonic() - t0
        report["checks"][name] = c
    report["seconds"] = time.monotonic() - t_all
    failed = [n for n, c in report["checks"].items() if not c["ok"]]
    print_table(report)
    if failed:
        print(f"guard: {len(only) - len(failed)} of {len(only)} checks within their limits "
              f"({report['seconds']:.0f} s); FAILED: {', '.join(failed)}")
    else:
        print(f"guard: every check within its limit ({report['seconds']:.0f} s)")
    for n in failed:
        c = report["checks"][n]
        if "error" in c:
            print(f"guard: {n}: {c['error']}", file=sys.stderr)
        else:
            print(f"guard: {n}: {c['what']} was {c['ratio']:.2f}x ({c['bound']}), past the guard's "
                  f"{c['limit']:.2f}x: a regression, or this machine far busier than CI's", file=sys.stderr)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(report, indent=1) + "\n")
    if failed or args.keep:
        log(f"run directories kept in {g.root}")
    else:
        shutil.rmtree(g.root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

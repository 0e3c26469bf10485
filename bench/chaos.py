#!/usr/bin/env python3
"""bench/chaos.py — a chaos campaign against the node link (issue 42): jobs of several airhosts
on this machine (127.0.0.1), a fault drawn from a seed in each round, and after each round the
invariants every user relies on. Real hosts, real signals, real sockets; light ranks
(bench/scripts/chaos_rank.py, no torch: what is under test is the hosts).

    .venv/bin/python bench/chaos.py                       # 200 rounds from seed 1
    .venv/bin/python bench/chaos.py --rounds 20 --seed 7 --max-hosts 4 --json-file chaos.json

Each round is a static job (--nnodes N) or an elastic one (--nnodes 2:N, or 2:N+1 when a
newcomer is to come) of 3 to --max-hosts hosts, 1 rank each, and one fault, at a random moment
once every rank is up:

  none          nothing: every host exits 0
  rank-crash    a rank exits 3: its host exits 3, the others 138 (static)
  kill          SIGKILL of any host, node 0 included: the others exit 138 (static; elastic:
                node 0 killed, 138; another killed, the others go on without it and exit 0)
  term          SIGTERM of any host: it exits 143, the others 138 (static)
  stop          SIGSTOP of a host other than node 0: the others exit 138 within --node-timeout
                (static); the stopped host is SIGKILLed once they are out
  flood         200 idle connections to node 0's port for 2 s: every host exits 0, in one attempt
                (a static job's node 0 has closed its port after the join: refused, rightly)
  newcomer-dies (elastic) a host comes, is held for the next scale-up, and is SIGKILLed: every
                other host exits 0, in one attempt

After each round, the invariants: every host's exit code by the contract of docs/multinode.md;
every host out within its bound (a fault: 6 s, moments plus a loaded machine's slack; a frozen
host: --node-timeout + 6 s; none: the ranks' time + 15 s); no process of the round left (each
carries CHAOS_ROUND in its environment); every run.json of a host that exited by itself final
(not "running") with that exit code; no line lost from any rank's log (numbered lines, without
a gap). Prints rounds, faults, violations and the worst time from the fault to the last host
out; exit status 1 on any violation. What it does not do yet: network namespaces and tc netem
(delay, loss, a partition), which tests/py/test_netns.py covers for two nodes.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANK = ROOT / "bench" / "scripts" / "chaos_rank.py"
FAULTS_STATIC = ("none", "rank-crash", "kill", "term", "stop", "flood")
FAULTS_ELASTIC = ("none", "kill", "flood", "newcomer-dies")
NODE_TIMEOUT = 5  # a loaded machine (CI: 3 pytest workers on 2 cores) may delay a heartbeat by seconds
FAULT_BOUND = 6.0  # seconds from a fault to the last host out: "moments", on a loaded 2-core box


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_airhost() -> str:
    for candidate in (ROOT / ".venv" / "bin" / "airhost", shutil.which("airhost")):
        if candidate and os.access(candidate, os.X_OK):
            return str(Path(candidate).resolve())
    sys.exit("chaos.py: no airhost found (.venv/bin/airhost or PATH); give --airhost")


class Host:
    def __init__(self, argv, env, workdir: Path, name: str):
        self.name = name
        self.workdir = workdir
        self.out = open(workdir / f"{name}.out", "wb")
        self.err = open(workdir / f"{name}.err", "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.out, stderr=self.err, cwd=workdir,
                                     start_new_session=True)
        self.ended_at: float | None = None
        self.runs = Path(env["AIRHOST_RUNS_DIR"])

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return rc

    def signal(self, sig: int) -> None:
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.out.close()
        self.err.close()

    def run_json(self) -> dict | None:
        found = sorted(self.runs.glob("*/run.json")) if self.runs.is_dir() else []
        return json.loads(found[-1].read_text()) if found else None

    def stderr_tail(self) -> str:
        self.err.flush()
        return (self.workdir / f"{self.name}.err").read_text(errors="replace")[-600:]


def round_processes(tag: str) -> list[int]:
    """The processes whose environment carries CHAOS_ROUND=tag: the round's hosts and ranks."""
    found, entry = [], f"CHAOS_ROUND={tag}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    with open(f"/proc/{d}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(d))
        except OSError:
            pass
    return found


def lines_lost(log: Path) -> str:
    """'' when every "line N" of a rank's log follows the one before it (N + 1, or 0 where a new
    attempt began); else what is missing."""
    if not log.is_file():
        return ""
    prev = None
    for text in log.read_text(errors="replace").splitlines():
        m = re.fullmatch(r"line (\d+)", text)
        if not m:
            continue
        n = int(m.group(1))
        if prev is not None and n not in (prev + 1, 0):
            return f"{log}: line {n} after line {prev}"
        prev = n
    return ""


def run_round(args, index: int, rng: random.Random, base: Path) -> dict:
    elastic = rng.random() < 0.35
    faults = FAULTS_ELASTIC if elastic else FAULTS_STATIC
    if args.faults:
        faults = tuple(f for f in faults if f in args.faults) or ("none",)
    fault = rng.choice(faults)
    n = rng.randint(3, args.max_hosts)
    seconds = round(rng.uniform(2.0, 3.0), 2)
    tag = f"{os.getpid()}-{index}"
    work = base / f"round-{index:04d}"
    work.mkdir()
    stamps = work / "stamps"
    stamps.mkdir()
    port = free_port()
    nnodes = f"2:{n + 1 if fault == 'newcomer-dies' else n}" if elastic else str(n)
    common = ["-n", "1", "--nnodes", nnodes, "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--node-timeout", f"{NODE_TIMEOUT}s", "--grace", "30"]
    if elastic:
        common += ["--join-settle", "1s", "--scale-up-interval", "10m", "--join-timeout", "20s"]
    env_base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRHOST_", "MLFLOW_", "SLURM_"))}
    env_base.update(AIRHOST_TRACKING="0", CHAOS_ROUND=tag)

    def start(name: str, node_rank: int | None) -> Host:
        env = dict(env_base, AIRHOST_RUNS_DIR=str(work / name / "runs"))
        argv = [args.airhost, str(RANK), *common]
        if node_rank is not None:
            argv += ["--node-rank", str(node_rank)]
        return Host([*argv, "--", str(stamps), str(seconds)], env, work, name)

    hosts = [start(f"host-{k}", k) for k in range(n)]
    record = {"round": index, "kind": "elastic" if elastic else "static", "hosts": n, "fault": fault,
              "violations": []}
    violations = record["violations"]
    deadline = time.monotonic() + 60
    while len(list(stamps.glob("up-*"))) < n and time.monotonic() < deadline:
        if any(h.poll() is not None for h in hosts):
            break
        time.sleep(0.02)
    if len(list(stamps.glob("up-*"))) < n:
        violations.append(f"only {len(list(stamps.glob('up-*')))} of {n} ranks came up")
        fault = "none"
    time.sleep(rng.uniform(0.2, 1.0))

    victim = rng.randrange(n) if fault in ("kill", "term") else rng.randrange(1, n)
    expected: dict[str, set[int]] = {h.name: {0} for h in hosts}
    bound = seconds + 15.0
    one_attempt = fault in ("flood", "newcomer-dies", "none")
    newcomer = None
    fault_at = time.monotonic()
    if fault == "rank-crash":
        (stamps / f"crash-{victim}").write_text("")
        expected = {h.name: {138} for h in hosts} | {f"host-{victim}": {3}}
        bound = FAULT_BOUND
    elif fault in ("kill", "term"):
        sig = signal.SIGKILL if fault == "kill" else signal.SIGTERM
        hosts[victim].signal(sig)
        code = -9 if fault == "kill" else 143
        if elastic and victim != 0:
            expected = {h.name: {0} for h in hosts} | {f"host-{victim}": {code}}
            bound = seconds * 2 + 15.0  # the group restarts without it and runs its ranks again
        else:
            expected = {h.name: {138} for h in hosts} | {f"host-{victim}": {code}}
            bound = FAULT_BOUND
    elif fault == "stop":
        hosts[victim].signal(signal.SIGSTOP)
        expected = {h.name: {138} for h in hosts}
        expected.pop(f"host-{victim}")
        bound = NODE_TIMEOUT + FAULT_BOUND
    elif fault == "flood":
        conns = []
        try:
            for _ in range(200):
                c = socket.socket()
                c.settimeout(2)
                c.connect(("127.0.0.1", port))
                conns.append(c)
        except OSError as e:
            # A static job's node 0 closes its port once every node joined (only an elastic
            # one keeps it, for nodes to come): nothing is listening to flood, and rightly so.
            if elastic:
                violations.append(f"flood: connection {len(conns)} refused by node 0's port: {e}")
        time.sleep(2)
        for c in conns:
            c.close()
    elif fault == "newcomer-dies":
        newcomer = start("newcomer", None)
        time.sleep(1.0)
        newcomer.signal(signal.SIGKILL)
    record["victim"] = victim if fault in ("rank-crash", "kill", "term", "stop") else None

    live = [h for h in hosts if h.name in expected]
    end_by = fault_at + bound + 30  # past the bound, we stop waiting (a violation) and clean up
    while any(h.poll() is None for h in live) and time.monotonic() < end_by:
        time.sleep(0.02)
    last_out = max((h.ended_at or time.monotonic()) for h in live)
    record["seconds_to_end"] = round(last_out - fault_at, 3)
    if record["seconds_to_end"] > bound:
        violations.append(f"the last host was out {record['seconds_to_end']:.2f} s after the fault (bound {bound:.1f} s)")
    for h in hosts + ([newcomer] if newcomer else []):
        if h.poll() is None:
            h.signal(signal.SIGCONT)
            h.signal(signal.SIGKILL)
            h.proc.wait()
            h.poll()
    for h in live:
        rc = h.proc.returncode
        if rc not in expected[h.name]:
            violations.append(f"{h.name} exited {rc}, expected {sorted(expected[h.name])}: {h.stderr_tail()!r}")
        rec = h.run_json()
        if rc == -9:
            continue  # SIGKILLed: its run.json says running, which `airhost runs` reads as lost
        if rec is None:
            violations.append(f"{h.name}: no run.json")
        elif rec["state"] == "running" or rec["exit_code"] != rc:
            violations.append(f"{h.name}: run.json says {rec['state']} exit {rec['exit_code']}, the host exited {rc}")
        elif one_attempt and len(rec.get("attempts") or []) != 1:
            violations.append(f"{h.name}: {len(rec['attempts'])} attempts where the fault ({fault}) should cost none")
    for h in live:  # a SIGKILLed host may have written half a line: its log is not checked
        rec = h.run_json() if h.proc.returncode != -9 else None
        if rec:
            for log in Path(rec["run_dir"]).glob("logs/rank-*.stdout.log"):
                if lost := lines_lost(log):
                    violations.append(f"{h.name}: {lost}")
    settle = time.monotonic() + 5
    left = round_processes(tag)
    while left and time.monotonic() < settle:
        time.sleep(0.1)
        left = round_processes(tag)
    if left:
        violations.append(f"processes left: {left}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for h in hosts + ([newcomer] if newcomer else []):
        h.close()
    if not violations and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-hosts", type=int, default=8)
    p.add_argument("--faults", type=lambda s: set(s.split(",")), default=None,
                   help="only these faults (comma-separated): " + ",".join(sorted(set(FAULTS_STATIC + FAULTS_ELASTIC))))
    p.add_argument("--airhost", default=None, help="the airhost binary (default: .venv/bin/airhost)")
    p.add_argument("--json-file", default=None)
    p.add_argument("--keep", action="store_true", help="keep every round's folder, not only those with a violation")
    args = p.parse_args()
    args.airhost = str(Path(args.airhost).resolve()) if args.airhost else default_airhost()
    if args.max_hosts < 3:
        p.error("--max-hosts is at least 3")
    base = Path(tempfile.mkdtemp(prefix="airhost-chaos-"))
    started = time.monotonic()
    records = []
    for i in range(args.rounds):
        rng = random.Random(args.seed * 100003 + i)
        r = run_round(args, i, rng, base)
        records.append(r)
        mark = "ok" if not r["violations"] else "VIOLATION"
        print(f"round {i:4d}  {r['kind']:7s} {r['hosts']} hosts  {r['fault']:13s} "
              f"end {r.get('seconds_to_end', float('nan')):6.2f} s  {mark}", flush=True)
        for v in r["violations"]:
            print(f"    {v}", flush=True)
    bad = [r for r in records if r["violations"]]
    faults: dict[str, int] = {}
    for r in records:
        faults[r["fault"]] = faults.get(r["fault"], 0) + 1
    worst = max((r for r in records if r["fault"] != "none"), key=lambda r: r.get("seconds_to_end", 0), default=None)
    print(f"chaos: {len(records)} rounds (seed {args.seed}, 3-{args.max_hosts} hosts) in {time.monotonic() - started:.0f} s; "
          f"faults: {', '.join(f'{k} {v}' for k, v in sorted(faults.items()))}")
    if worst:
        print(f"chaos: worst time from a fault to the last host out: {worst['seconds_to_end']:.2f} s "
              f"(round {worst['round']}, {worst['fault']}, {worst['hosts']} hosts)")
    print(f"chaos: {sum(len(r['violations']) for r in records)} violation(s) in {len(bad)} round(s)"
          + (f"; their folders are under {base}" if bad else ""))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps({"seed": args.seed, "rounds": records}, indent=1))
    if not bad and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

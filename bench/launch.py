#!/usr/bin/env python3
"""Launch benchmark: airhost against torchrun on one node.

    .venv/bin/python bench/launch.py                  # 4 ranks, 5 repeats, a table
    .venv/bin/python bench/launch.py --repeats 9 --json

1. Start-up: seconds from launching the command until EVERY rank has run its first line of
   user code, for `airhost S --accelerators N` and `torchrun --standalone --nproc-per-node N S`
   (plus plain `python S`, one process, as the floor). Target: airhost/torchrun <= 0.7.
2. Steady state: wall time, launch to exit, of a short N-rank gloo DDP training script under
   both launchers. Target: airhost/torchrun <= 1.0 (airhost no slower).

The two launchers alternate within every repeat (the order flips each repeat), after one
uncounted warm-up run of each. Every run gets its own temporary directory, both launchers
get OMP_NUM_THREADS=1, every run must exit 0 with every rank accounted for, and no rank
process may outlive its launcher. bench/README.md explains how to read the output.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STARTUP_TARGET = 0.7  # airhost / torchrun, medians of launch -> last rank's first line
STEADY_TARGET = 1.0   # airhost / torchrun, medians of launch -> exit of the DDP script

STAMP_ENV = "AIRHOST_BENCH_STAMPS"  # the directory where ranks write their time stamps
STEPS_ENV = "AIRHOST_BENCH_STEPS"

# The very first statement takes the time: nothing may run before it but `import time`
# (a built-in module, already loaded by the interpreter). Each rank then writes its stamp
# and pid to a file of its own, imports torch, stamps again, and exits.
STARTUP_SCRIPT = """\
import time; _t_first = time.time()
import os
_dir = os.environ["AIRHOST_BENCH_STAMPS"]
_rank = os.environ.get("RANK", "0")
with open(os.path.join(_dir, "first." + _rank), "w") as _f:
    _f.write("%r %d\\n" % (_t_first, os.getpid()))
import torch
with open(os.path.join(_dir, "torch." + _rank), "w") as _f:
    _f.write("%r\\n" % time.time())
"""

# A short gloo DDP run: a small MLP, synthetic data, AIRHOST_BENCH_STEPS optimizer steps.
DDP_SCRIPT = """\
import time; _t_first = time.time()
import os
_dir = os.environ["AIRHOST_BENCH_STAMPS"]
_rank = os.environ.get("RANK", "0")
with open(os.path.join(_dir, "first." + _rank), "w") as _f:
    _f.write("%r %d\\n" % (_t_first, os.getpid()))
import gc
import json
import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

t_torch = time.time()
steps = int(os.environ.get("AIRHOST_BENCH_STEPS", "200"))
dist.init_process_group("gloo")
t_pg = time.time()
rank = dist.get_rank()

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()
w = torch.randn(32, 1, generator=torch.Generator().manual_seed(0))
g = torch.Generator().manual_seed(1 + rank)
batches = []
for _ in range(16):
    x = torch.randn(64, 32, generator=g)
    batches.append((x, x @ w + 0.01 * torch.randn(64, 1, generator=g)))

dist.barrier()
t_train0 = time.time()
for step in range(steps):
    x, y = batches[step % len(batches)]
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
final_loss = loss.item()
t_train1 = time.time()
# Free the DDP model (its reducer holds gloo work) before the process group goes: with
# torch 2.13 a rank that still holds them aborts now and then at interpreter exit
# ("terminate called without an active exception"), under torchrun and airhost alike.
del model, optimizer, loss, x, y, batches
gc.collect()
dist.destroy_process_group()
t_end = time.time()

with open(os.path.join(_dir, "result." + _rank), "w") as _f:
    json.dump({"torch": t_torch, "pg": t_pg, "train0": t_train0, "train1": t_train1,
               "end": t_end, "steps": steps, "loss": final_loss}, _f)
sys.exit(0 if math.isfinite(final_loss) else 3)
"""


class BenchError(Exception):
    """A run failed; the message says which and why (with the launcher's stderr)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes


def _proc_marker(stamp_dir: Path) -> bytes:
    return f"{STAMP_ENV}={stamp_dir}".encode() + b"\0"


def run_processes(stamp_dir: Path) -> list[int]:
    """Live processes (not zombies) of one run: those whose environment names its stamp
    directory. Both launchers pass their environment on to the ranks, and the ranks to
    their own children, so this finds every process the run started, and only those."""
    marker = _proc_marker(stamp_dir)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours
            continue
        if marker in env:  # a zombie's environ reads empty
            found.append(int(entry))
    return found


def kill_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_leftovers(stamp_dir: Path, wait_s: float = 5.0) -> list[int]:
    """Waits up to wait_s for the run's processes to be gone; kills (by pid) and returns
    those that were still alive then."""
    deadline = time.monotonic() + wait_s
    while True:
        left = run_processes(stamp_dir)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if left:
        kill_pids(left, signal.SIGKILL)
    return left


# --------------------------------------------------------------------------- one run


def tail(path: Path, lines: int = 80) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(unreadable)"
    rows = text.splitlines()
    if len(rows) > lines:
        rows = [f"... ({len(rows) - lines} earlier lines in {path})"] + rows[-lines:]
    return "\n".join(rows) if rows else "(empty)"


def run_once(name: str, argv: list[str], run_dir: Path, cwd: Path, nranks: int,
             timeout_s: float, extra_env: dict[str, str]) -> dict:
    """Starts argv, waits for it to exit, checks it and every one of its ranks, and returns
    the run's time stamps relative to the launch."""
    stamps = run_dir / "stamps"
    stamps.mkdir(parents=True)
    (run_dir / "tmp").mkdir()
    env = dict(os.environ)
    env.update(extra_env)
    env[STAMP_ENV] = str(stamps)
    env["OMP_NUM_THREADS"] = "1"
    # Like for like: torchrun makes no MLflow run, so airhost makes none either here.
    env["AIRHOST_TRACKING"] = "0"
    env["TMPDIR"] = str(run_dir / "tmp")  # torchrun's log dirs etc. stay inside the run
    out_path, err_path = run_dir / "stdout", run_dir / "stderr"
    timed_out = threading.Event()

    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t_launch = time.time()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)

        def on_timeout():
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            # A launcher that does not take its ranks down within 30 s: kill it and them.
            kill = threading.Timer(30, lambda: (kill_pids(run_processes(stamps), signal.SIGKILL),
                                                proc.kill()))
            kill.daemon = True
            kill.start()

        # A blocking wait() returns the moment the launcher exits; wait(timeout) would poll.
        timer = threading.Timer(timeout_s, on_timeout)
        timer.daemon = True
        timer.start()
        try:
            rc = proc.wait()
            t_exit = time.time()
        except BaseException:  # Ctrl-C: take the run down before leaving
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            reap_leftovers(stamps, wait_s=0)
            raise
        finally:
            timer.cancel()

    def fail(why: str) -> BenchError:
        return BenchError(
            f"{name} run failed: {why}\n  command: {' '.join(argv)}\n  run dir: {run_dir}\n"
            f"--- stderr ---\n{tail(err_path)}\n--- stdout ---\n{tail(out_path, 20)}")

    # Nothing of the run may outlive the launcher.
    leftovers = reap_leftovers(stamps)
    if timed_out.is_set():
        raise fail(f"no exit within {timeout_s:g} s (killed)")
    if rc != 0:
        raise fail(f"exit status {rc}")
    if leftovers:
        raise fail(f"{len(leftovers)} process(es) still running after the launcher exited: "
                   f"pids {leftovers} (killed)")

    result: dict = {"launch_to_exit": t_exit - t_launch}
    firsts = {}
    for r in range(nranks):
        try:
            t, pid = (stamps / f"first.{r}").read_text().split()
        except (OSError, ValueError):
            raise fail(f"rank {r} never wrote its first-line stamp") from None
        firsts[r] = float(t) - t_launch
    result["first_line_per_rank"] = [firsts[r] for r in range(nranks)]
    result["first_line"] = max(firsts.values())  # the LAST rank to get there
    if min(firsts.values()) < 0:
        raise fail("a rank's first-line stamp is earlier than the launch (clock?)")

    torch_files = sorted(stamps.glob("torch.*"))
    if torch_files:
        if len(torch_files) != nranks:
            raise fail(f"{len(torch_files)} of {nranks} ranks imported torch")
        result["torch_imported"] = max(float(p.read_text()) for p in torch_files) - t_launch

    result_files = sorted(stamps.glob("result.*"))
    if result_files:
        if len(result_files) != nranks:
            raise fail(f"{len(result_files)} of {nranks} ranks finished training")
        res = [json.loads(p.read_text()) for p in result_files]
        result["torch_imported"] = max(x["torch"] for x in res) - t_launch
        result["pg_ready"] = max(x["pg"] for x in res) - t_launch
        result["train_start"] = max(x["train0"] for x in res) - t_launch
        result["train_loop"] = max(x["train1"] - x["train0"] for x in res)
        result["pg_destroyed"] = max(x["end"] for x in res) - t_launch
        result["steps"] = res[0]["steps"]
        result["loss"] = res[0]["loss"]
    return result


# --------------------------------------------------------------------------- statistics


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine_info(python: str, airhost: str) -> dict:
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    cpu_model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpu_max = None
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpu_max = int(quota) / int(period)
    except (OSError, ValueError):
        pass
    versions = out([python, "-c", "import platform, importlib.metadata as m; "
                    "print(platform.python_version(), m.version('torch'))"]).split()
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cgroup_cpu_limit": cpu_max,
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "python": versions[0] if len(versions) == 2 else "?",
        "torch": versions[1] if len(versions) == 2 else "?",
        "airhost": out([airhost, "--version"]) or "?",
        "loadavg_start": os.getloadavg()[0],
    }


class CpuMeter:
    """CPU time that processes other than this benchmark (and the runs it starts) used while
    it ran: busy time of the whole machine from /proc/stat, less our own and our reaped
    children's. Other work on the machine competes with the ranks and skews the figures."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            # user + nice + system: interrupt time is left out, since the ranks' own
            # loopback traffic lands there and is charged to no process.
            busy = sum(fields[:3]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            busy = float("nan")
        ours = sum(os.times()[:4])  # user + system, self + reaped children
        return time.monotonic(), busy, ours

    def other_cpus(self) -> float:
        """Average number of CPUs other processes kept busy since the start."""
        t0, busy0, ours0 = self.start
        t1, busy1, ours1 = self._sample()
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(t1 - t0, 1e-9)


# --------------------------------------------------------------------------- output


def fmt(x: float) -> str:
    return f"{x:7.3f}"


def verdict(ratio: float, target: float) -> str:
    return "PASS" if ratio <= target else "MISS"


def print_report(rep: dict) -> None:
    m, cfg = rep["machine"], rep["config"]
    limit = f", cgroup limit {m['cgroup_cpu_limit']:g} CPUs" if m["cgroup_cpu_limit"] else ""
    print(f"airhost launch benchmark: {cfg['ranks']} ranks, {cfg['repeats']} repeats "
          f"(+{cfg['warmup']} warm-up), launchers alternated, OMP_NUM_THREADS=1")
    print(f"machine: nproc {m['nproc']} ({m['cpus_usable']} usable{limit}), {m['cpu_model']}, "
          f"Linux {m['kernel']}")
    print(f"         Python {m['python']}, torch {m['torch']}, {m['airhost']}; "
          f"load avg {m['loadavg_start']:.2f} -> {m['loadavg_end']:.2f}")
    print(f"         other processes kept {m['other_cpus']:.2f} CPUs busy on average while it ran")
    if not m["other_cpus"] <= 0.1 * m["cpus_usable"]:
        print(f"WARNING: other work used {m['other_cpus']:.2f} of the {m['cpus_usable']} CPUs "
              f"during the benchmark: the figures are noisy; rerun on a quiet machine")
    print()

    su = rep["startup"]
    n = cfg["ranks"]
    labels = {"python": "python S (1 process, floor)",
              "airhost": f"airhost S --accelerators {n}",
              "torchrun": f"torchrun --standalone --nproc-per-node {n} S"}
    W = max(len(v) for v in labels.values())
    print("1. Start-up: launch -> every rank has run its first line of user code (seconds)")
    print(f"   {'':{W}} {'median':>7} {'min':>7} {'max':>7} | {'+torch':>7} {'exit':>7}")
    for key in ("python", "airhost", "torchrun"):
        s = su[key]
        fl = s["first_line"]
        print(f"   {labels[key]:{W}} {fmt(fl['median'])} {fmt(fl['min'])} {fmt(fl['max'])} | "
              f"{fmt(s['torch_imported']['median'])} {fmt(s['launch_to_exit']['median'])}")
    r = rep["ratios"]["startup"]
    print(f"   ratio airhost/torchrun (medians): {r['value']:.3f}   target <= {r['target']}   "
          f"{r['verdict']}")
    print(f"   (+torch: median launch -> every rank has imported torch; exit: median launch -> "
          f"launcher exit)")
    print()

    st = rep["steady"]
    print(f"2. Steady state: {n}-rank gloo DDP MLP, {cfg['steps']} steps; launch -> launcher exit "
          f"(seconds)")
    print(f"   {'':{W}} {'median':>7} {'min':>7} {'max':>7} | {'1st line':>8} {'pg ready':>8} "
          f"{'train':>7} {'pg done':>7}")
    for key in ("airhost", "torchrun"):
        s = st[key]
        w = s["launch_to_exit"]
        print(f"   {labels[key]:{W}} {fmt(w['median'])} {fmt(w['min'])} {fmt(w['max'])} | "
              f"{s['first_line']['median']:8.3f} {s['pg_ready']['median']:8.3f} "
              f"{fmt(s['train_loop']['median'])} {fmt(s['pg_destroyed']['median'])}")
    r = rep["ratios"]["steady"]
    print(f"   ratio airhost/torchrun (medians): {r['value']:.3f}   target <= {r['target']}   "
          f"{r['verdict']}")
    rt = rep["ratios"]["steady_train_loop"]
    print(f"   (context) train loop alone, airhost/torchrun: {rt['value']:.3f}")
    print(f"   (1st line, pg ready, pg done: medians, launch -> last rank has run its first line,"
          f" has its process")
    print(f"   group, has destroyed it; train: median of the slowest rank's {cfg['steps']}-step "
          f"loop)")
    print()

    print("Per run, launch -> exit (seconds), in run order:")
    for bench, title in (("startup", "start-up"), ("steady", "steady")):
        for key in ("python", "airhost", "torchrun"):
            if key not in rep[bench]:
                continue
            runs = rep[bench][key]["runs"]
            vals = " ".join(f"{x['launch_to_exit']:.3f}" for x in runs)
            print(f"   {title:9} {key:9} {vals}")
    print("Per run, start-up launch -> last rank's first line (seconds), in run order:")
    for key in ("python", "airhost", "torchrun"):
        vals = " ".join(f"{x['first_line']:.3f}" for x in su[key]["runs"])
        print(f"   {'':9} {key:9} {vals}")


# --------------------------------------------------------------------------- main


def find_tool(name: str, given: str | None) -> str:
    if given:
        return given
    here = Path(sys.executable).parent / name  # the venv's bin/ when run as .venv/bin/python
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"launch.py: cannot find `{name}`; run scripts/setup.sh, or pass "
                         f"--{name} PATH")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4, help="ranks per run (default: 4)")
    ap.add_argument("--repeats", type=int, default=5, help="measured runs of each (default: 5)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--warmup", type=int, default=1,
                    help="uncounted runs of each command first (default: 1)")
    ap.add_argument("--steps", type=int, default=200, help="DDP training steps (default: 200)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run (default: 600)")
    ap.add_argument("--airhost", help="airhost executable (default: next to this python)")
    ap.add_argument("--torchrun", help="torchrun executable (default: next to this python)")
    ap.add_argument("--python", help="python for the floor (default: next to this python)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = ap.parse_args()
    if args.ranks < 1 or args.repeats < 1 or args.warmup < 0 or args.steps < 1:
        ap.error("--ranks, --repeats and --steps must be >= 1, --warmup >= 0")

    airhost = find_tool("airhost", args.airhost)
    torchrun = find_tool("torchrun", args.torchrun)
    python = args.python or str(Path(sys.executable).parent / "python")
    if not Path(python).exists():
        python = sys.executable

    root = Path(tempfile.mkdtemp(prefix="airhost-bench-"))
    (root / "startup_script.py").write_text(STARTUP_SCRIPT)
    (root / "ddp_script.py").write_text(DDP_SCRIPT)
    n = str(args.ranks)
    counter = [0]

    def commands(script: str) -> dict:
        path = str(root / script)
        return {
            "python": lambda d: [python, path],
            "airhost": lambda d: [airhost, path, "--accelerators", n, "--run-dir",
                                  str(d / "airhost-run")],
            "torchrun": lambda d: [torchrun, "--standalone", "--nproc-per-node", n, path],
        }

    def one(bench: str, key: str, cmd, tag: str) -> dict:
        counter[0] += 1
        run_dir = root / f"{counter[0]:03d}-{bench}-{key}-{tag}"
        nranks = 1 if key == "python" else args.ranks
        return run_once(key, cmd(run_dir), run_dir, root, nranks, args.timeout,
                        {STEPS_ENV: str(args.steps)})

    def series(bench: str, script: str, keys: list[str]) -> dict:
        cmds = commands(script)
        runs: dict = {k: [] for k in keys}
        for w in range(args.warmup):
            for k in keys:
                one(bench, k, cmds[k], f"warmup{w}")
        for i in range(args.repeats):
            pair = ["airhost", "torchrun"] if i % 2 == 0 else ["torchrun", "airhost"]
            order = pair + [k for k in keys if k not in pair]
            line = []
            for k in order:
                res = one(bench, k, cmds[k], f"rep{i}")
                runs[k].append(res)
                shown = res["first_line"] if bench == "startup" else res["launch_to_exit"]
                line.append(f"{k} {shown:.3f}s")
            log(f"  {bench} {i + 1}/{args.repeats}: " + ", ".join(line))
        out = {}
        for k in keys:
            rs = runs[k]
            out[k] = {"runs": rs}
            for metric in ("first_line", "torch_imported", "pg_ready", "train_start",
                           "train_loop", "pg_destroyed", "launch_to_exit"):
                if all(metric in r for r in rs):
                    out[k][metric] = summary([r[metric] for r in rs])
        return out

    ok = False
    meter = CpuMeter()
    try:
        machine = machine_info(python, airhost)
        log(f"launch benchmark: {args.ranks} ranks, {args.repeats} repeats, temp dir {root}")
        log(f"  airhost {airhost}\n  torchrun {torchrun}\n  python {python}")
        startup = series("startup", "startup_script.py", ["airhost", "torchrun", "python"])
        steady = series("steady", "ddp_script.py", ["airhost", "torchrun"])
        machine["loadavg_end"] = os.getloadavg()[0]
        machine["other_cpus"] = meter.other_cpus()
        ok = True
    except BenchError as e:
        log(f"launch.py: {e}")
        log(f"launch.py: run directories kept in {root}")
        return 1
    except KeyboardInterrupt:
        log(f"launch.py: interrupted; run directories kept in {root}")
        return 130
    finally:
        if ok and not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    def ratio(bench, metric, target=None):
        a = bench["airhost"][metric]["median"]
        t = bench["torchrun"][metric]["median"]
        value = a / t
        r = {"value": value, "airhost_median": a, "torchrun_median": t}
        if target is not None:
            r.update(target=target, verdict=verdict(value, target))
        return r

    report = {
        "machine": machine,
        "config": {"ranks": args.ranks, "repeats": args.repeats, "warmup": args.warmup,
                   "steps": args.steps, "airhost": airhost, "torchrun": torchrun,
                   "python": python, "omp_num_threads": 1},
        "startup": startup,
        "steady": steady,
        "ratios": {
            "startup": ratio(startup, "first_line", STARTUP_TARGET),
            "steady": ratio(steady, "launch_to_exit", STEADY_TARGET),
            "steady_train_loop": ratio(steady, "train_loop"),
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    if args.keep:
        log(f"run directories kept in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

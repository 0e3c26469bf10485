"""From a machine with only Python to the first line of a 2-rank run, with airhost's wheels.

    python bench/install.py [--dist dist] [--pythons 3.10,3.11,3.12,3.13] [--repeats 3] [--json]

For each wheel of dist/ (scripts/build-wheels.sh): its size; `python -m venv`; `pip install
--no-index --find-links dist` of airhost into that fresh venv (cloudpickle and fsspec from a
local folder too: nothing is downloaded while timing); then `airhost hello.py -n 2` until the
first rank's line reaches the terminal, and until the run has ended. The peer, on 3.11 in the
same run: installing torch (the CPU wheel on this machine's disk), which every user of airhost
installs anyway and which brings torchrun, and torchrun's own first line of the same 2-rank
script: what airhost adds to a node's set-up, as a ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELLO = "import os\nprint('rank', os.environ['RANK'], 'up', flush=True)\n"


def find_python(v: str) -> str | None:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for c in [*sorted(root.glob(f"versions/{v}.*/bin/python{v}")), shutil.which(f"python{v}")]:
        if c and os.access(c, os.X_OK):
            return str(c)
    return None


def timed(cmd: list[str], **kw) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return time.perf_counter() - t


def first_line(cmd: list[str], pattern: str, env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Seconds to the first output line matching `pattern`, and to the command's end."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    first = None
    for line in p.stdout:
        if first is None and re.search(pattern, line):
            first = time.perf_counter() - t
    p.wait()
    end = time.perf_counter() - t
    if p.returncode != 0 or first is None:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode} (first line seen: {first is not None})")
    return first, end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", default=str(REPO / "dist"))
    ap.add_argument("--pythons", default="3.10,3.11,3.12,3.13")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dist = Path(a.dist)
    version = re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    work = Path(tempfile.mkdtemp(prefix="airhost-bench-install-"))
    deps = work / "deps"
    timed([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(deps),
           "cloudpickle>=2.0", "fsspec>=2023.1"])
    (work / "hello.py").write_text(HELLO)
    rows = []
    for v in a.pythons.split(","):
        py = find_python(v)
        tag = "cp" + v.replace(".", "")
        wheel = next(dist.glob(f"airhost-{version}-{tag}-{tag}-*.whl"), None)
        if not py or not wheel:
            print(f"skipping {v}: {'no Python' if not py else 'no wheel in ' + str(dist)}", file=sys.stderr)
            continue
        samples = {"venv": [], "install": [], "first_line": [], "run_end": []}
        for i in range(a.repeats):
            venv = work / f"venv-{v}-{i}"
            samples["venv"].append(timed([py, "-m", "venv", str(venv)]))
            samples["install"].append(timed([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                                             "--no-index", "--find-links", str(dist), "--find-links", str(deps), "airhost"]))
            env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(work), "AIRHOST_TRACKING": "0",
                   "AIRHOST_RUNS_DIR": str(work / "runs")}
            first, end = first_line([str(venv / "bin" / "airhost"), "hello.py", "-n", "2"], r"^\[rank \d\] rank \d up",
                                    env, str(work))
            samples["first_line"].append(first)
            samples["run_end"].append(end)
            shutil.rmtree(venv)
        med = {k: statistics.median(s) for k, s in samples.items()}
        rows.append({"python": v, "wheel": wheel.name, "wheel_kib": wheel.stat().st_size // 1024, **med,
                     "total_to_first_line": med["venv"] + med["install"] + med["first_line"]})

    # The peer on 3.11: torch's own install (it brings torchrun) and torchrun's first line.
    peer = {}
    py311 = find_python("3.11")
    if py311:
        venv = work / "venv-torch"
        timed([py311, "-m", "venv", str(venv)])
        peer["torch_install"] = timed([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                                       "torch==2.13.0"])
        env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(work), "OMP_NUM_THREADS": "1"}
        firsts = [first_line([str(venv / "bin" / "torchrun"), "--nproc-per-node", "2", "hello.py"], r"rank \d up",
                             env, str(work))[0] for _ in range(a.repeats)]
        peer["torchrun_first_line"] = statistics.median(firsts)
    shutil.rmtree(work, ignore_errors=True)

    if a.json:
        print(json.dumps({"rows": rows, "peer": peer}, indent=2))
        return
    print(f"{'python':7} {'wheel':>9} {'venv':>7} {'pip install':>12} {'1st line':>9} {'run end':>8} {'total':>7}")
    for r in rows:
        print(f"{r['python']:7} {r['wheel_kib']:>6} KiB {r['venv']:>6.2f}s {r['install']:>11.2f}s "
              f"{r['first_line']:>8.3f}s {r['run_end']:>7.3f}s {r['total_to_first_line']:>6.2f}s")
    if peer and (r311 := next((r for r in rows if r["python"] == "3.11"), None)):
        print(f"pip install airhost / pip install torch (3.11): {r311['install']:.2f}s / {peer['torch_install']:.1f}s = "
              f"{r311['install'] / peer['torch_install']:.3f}x")
        print(f"first line of 2 ranks, airhost / torchrun (3.11, no torch import): {r311['first_line']:.3f}s / "
              f"{peer['torchrun_first_line']:.3f}s = {r311['first_line'] / peer['torchrun_first_line']:.2f}x")


if __name__ == "__main__":
    main()

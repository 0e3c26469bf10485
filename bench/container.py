"""bench/container.py — airhost as a container's entrypoint, timed as a user meets it: the image's
size, and `podman run IMAGE startup.py -n 2` from the command to the last of the 2 ranks past
`import torch` (cold: a fresh container each time), against `torchrun --nproc-per-node 2` of the
same script in the same image (`podman run --entrypoint torchrun`), and plain `python` (one
process, the floor), the three alternating, medians of --rounds.

    .venv/bin/python bench/container.py [--image TAG] [--rounds 5] [--json-file F]

Without --image it builds deploy/Dockerfile's image with scripts/container-image.sh (dist/'s
wheel for CPython 3.11, torch's CPU wheel). Needs podman (scripts/setup.sh with
AIRHOST_SETUP_TEST_DEPS=1 installs it) and root.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "bench" / "scripts"
ENV = dict(os.environ, CONTAINERS_CONF=str(REPO / "tests" / "container" / "containers.conf"))


def podman(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"container.py: podman {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def once(image: str, launcher: str) -> float:
    """Seconds from `podman run` to the last rank's stamp after `import torch`."""
    with tempfile.TemporaryDirectory() as stamps:
        mounts = ["-v", f"{SCRIPTS}:/bench:ro", "-v", f"{stamps}:/stamps", "-e", "AIRHOST_BENCH_STAMPS=/stamps",
                  "-e", "AIRHOST_TRACKING=0", "-w", "/tmp"]
        ranks = 2
        if launcher == "airhost":
            argv = [*mounts, image, "/bench/startup.py", "-n", "2", "--cold"]
        elif launcher == "torchrun":
            argv = [*mounts, "--entrypoint", "torchrun", image, "--nproc-per-node", "2", "/bench/startup.py"]
        else:
            argv, ranks = [*mounts, "--entrypoint", "python", image, "/bench/startup.py"], 1
        t0 = time.time()
        podman("run", "--rm", *argv)
        return max(json.loads((Path(stamps) / f"torch.{r}").read_text())["t"] for r in range(ranks)) - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", help="an image of deploy/Dockerfile (default: build one from dist/)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json-file")
    a = p.parse_args()
    image = a.image
    if not image:
        image = "localhost/airhost:bench"
        subprocess.run([str(REPO / "scripts" / "container-image.sh"), image], env=ENV, check=True)
    size = int(podman("image", "inspect", image, "--format", "{{.Size}}").strip())
    launchers = ("airhost", "torchrun", "python")
    for launcher in launchers:  # one uncounted round each: the page cache warm for all
        once(image, launcher)
    times: dict[str, list[float]] = {k: [] for k in launchers}
    for i in range(a.rounds):
        order = launchers[i % 3:] + launchers[:i % 3]
        for launcher in order:
            times[launcher].append(once(image, launcher))
            print(f"[container] round {i + 1}/{a.rounds} {launcher}: {times[launcher][-1]:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    when = time.strftime("%Y-%m-%d")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, podman {podman('--version').split()[-1]}"
    print(f"\ncontainer ({when}, {machine}): image {image} {size / 2**20:.0f} MiB")
    print(f"{'podman run -> last rank past import torch':44} {'median':>8}  {'vs torchrun':>11}")
    for k in launchers:
        what = {"airhost": "airhost -n 2 (the entrypoint)", "torchrun": "torchrun --nproc-per-node 2",
                "python": "python, 1 process (floor)"}[k]
        print(f"{what:44} {med[k]:7.2f}s  {med[k] / med['torchrun']:10.2f}x")
    if a.json_file:
        Path(a.json_file).write_text(json.dumps({"date": when, "machine": machine, "image_mib": size / 2**20,
                                                 "runs": times, "median": med}, indent=1))


if __name__ == "__main__":
    main()

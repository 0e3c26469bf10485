"""The docs' MLP example (examples/notebook.ipynb, its code cells verbatim) through the Python
API, then a wrong accelerator_type. Used by scripts/gpu-check.sh; prints one `api:` and one
`type:` line each starting PASS or FAIL, and exits 1 when either failed.

On a GPU node the example's `@distributed(num_accelerators=2)` becomes
`@distributed(accelerator_type=T)` with T the type airhost detects for the node (GPU_1xH200 on
one H200), so that the type is checked against the node and the ranks train on every GPU over
NCCL; without a GPU the cells run exactly as written (2 CPU ranks over gloo).
"""
import json
import os
import sys
import time
from pathlib import Path

import __main__

ROOT = Path(__file__).resolve().parents[2]
from airhost import AcceleratorType, distributed  # noqa: E402
from airhost import _accelerators  # noqa: E402

node = _accelerators.detect()
cells = ["".join(c["source"]) for c in json.loads((ROOT / "examples/notebook.ipynb").read_text())["cells"]
         if c["cell_type"] == "code"]
source = "\n\n".join(cells)
detected = None
if node.gpus:
    name = f"GPU_{len(node.gpus)}x{node.model}"
    detected = next((t.value for t in AcceleratorType if t.value == name), None)
    decorator = f'@distributed(accelerator_type="{detected}")' if detected else "@distributed()"
    assert "@distributed(num_accelerators=2)" in source, "the notebook's decorator changed: update this check"
    source = source.replace("@distributed(num_accelerators=2)", decorator)
    print(f"node: {node.describe()}, model {node.model}, accelerator type {detected or '(none in the table)'}",
          flush=True)

failed = False
t0 = time.monotonic()
try:
    exec(compile(source, "examples/notebook.ipynb", "exec"), __main__.__dict__)
    results = __main__.results
    ranks = len(results)
    want_ranks = len(node.gpus) if node.gpus else 2
    ok = ranks == want_ranks and len(set(results)) == 1 and results[0] < 0.05
    backend = "NCCL on " + node.describe() if node.gpus else "gloo on CPU"
    print(f"api: {'PASS' if ok else 'FAIL'} the docs' MLP example through @distributed in "
          f"{time.monotonic() - t0:.1f} s, {ranks} rank(s) ({backend}), accelerator_type "
          f"{detected or '-'}, final loss {results[0]:.5f} on every rank: {results}", flush=True)
    failed |= not ok
except Exception as e:  # noqa: BLE001 — the check reports any failure as FAIL with its cause
    print(f"api: FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    failed = True

# A type naming another GPU model must fail before anything starts, naming both.
if node.gpus:
    wrong = "GPU_1xA10" if node.model != "A10" else "GPU_1xL4"

    @distributed(accelerator_type=wrong)
    def never():
        raise AssertionError("a rank started for a wrong accelerator_type")

    t0 = time.monotonic()
    try:
        never.distributed()
        print(f"type: FAIL accelerator_type={wrong} on {node.describe()} was not refused", flush=True)
        failed = True
    except ValueError as e:
        said = str(e)
        ok = wrong in said and (node.model or "") in said
        print(f"type: {'PASS' if ok else 'FAIL'} {wrong} refused before launch in "
              f"{(time.monotonic() - t0) * 1000:.0f} ms: {said}", flush=True)
        failed |= not ok
sys.exit(1 if failed else 0)

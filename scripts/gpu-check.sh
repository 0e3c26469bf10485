#!/usr/bin/env bash
# gpu-check.sh — the checks that need a real NVIDIA GPU, in one go, with a PASS/FAIL summary.
# Run it on an x86_64 Debian/Ubuntu machine with the NVIDIA driver (nvidia-smi works), from
# anywhere: scripts/gpu-check.sh. The checks themselves take well under 5 minutes:
#
#   1. build     scripts/setup.sh: apt packages, .venv, pip install . (skipped with
#                AIRHOST_GPU_CHECK_NO_SETUP=1 when .venv/bin/airhost is already built)
#   2. torch     .venv's torch is a CUDA build and sees the GPU(s)
#   3. doctor    `airhost doctor`: GPUs, topology, CUDA memory and SGEMM, NCCL all-reduce
#                table; exit 0 wanted
#   4. json      `airhost doctor --json`: one valid JSON object, exit 0, all-reduce ran
#   5. ddp       `airhost examples/mlp_ddp.py --accelerators 1 --preflight`: the unchanged
#                example, 1 rank over NCCL (NCCL_DEBUG=INFO shows NCCL's version line);
#                exit 0 wanted (its loss must fall below 0.05)
#   6. fsdp      `airhost examples/fsdp.py --accelerators N`: FSDP2 (fully_shard) on a cuda
#                device mesh over NCCL, N = 2 where the node has 2 GPUs or more, else 1; exit 0
#                wanted (loss below 0.05, every rank gathers the same full weights)
#   7. deepspeed `airhost examples/deepspeed_zero.py --accelerators N`: DeepSpeed ZeRO-3 on its
#                CUDA accelerator over NCCL (deepspeed==0.19.8 is pip-installed into .venv
#                first when it is missing); exit 0 wanted, as for fsdp
#
# The CUDA runtime, NCCL and cuBLAS come from the system (ldconfig's path, /usr/local/cuda)
# or from the NVIDIA wheels torch brings into .venv (nvidia-nccl-cu12, nvidia-cuda-runtime-
# cu12, nvidia-cublas-cu12), which `airhost doctor` finds by itself; AIRHOST_CUDART_LIBRARY,
# AIRHOST_NCCL_LIBRARY and AIRHOST_CUBLAS_LIBRARY name a file to use instead.
#
# torch: scripts/setup.sh pins torch; where its index serves the CPU build, replace it with
# the CUDA build of the same version, for a CUDA not newer than the driver's (the "CUDA
# Version" nvidia-smi prints), e.g. CUDA 12.8:
#     .venv/bin/python -m pip install --force-reinstall "torch==2.13.0" \
#         --index-url https://download.pytorch.org/whl/cu128
# or let this script do it: AIRHOST_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128.
#
# Output: a summary on stdout; every step's full output in $AIRHOST_GPU_CHECK_LOGS (default
# build/gpu-check/). Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
LOGS=${AIRHOST_GPU_CHECK_LOGS:-$ROOT/build/gpu-check}
mkdir -p "$LOGS"
# Another build to check (a cmake build tree's airhost, say): AIRHOST_GPU_CHECK_BIN, with the
# interpreter whose torch its ranks use in AIRHOST_GPU_CHECK_PYTHON; setup is then skipped.
PY=${AIRHOST_GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python}
AIRHOST=${AIRHOST_GPU_CHECK_BIN:-$ROOT/.venv/bin/airhost}
[ -n "${AIRHOST_GPU_CHECK_BIN:-}" ] && AIRHOST_GPU_CHECK_NO_SETUP=1

names=()
results=()
details=()
record() {  # record NAME PASS|FAIL|SKIP DETAIL
  names+=("$1")
  results+=("$2")
  details+=("$3")
  printf '%-9s %-4s %s\n' "$1" "$2" "$3"
}
started=$(date +%s)

echo "== airhost GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), logs in $LOGS)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >"$LOGS/nvidia-smi.txt" 2>&1 || true
  nvidia-smi topo -m >>"$LOGS/nvidia-smi.txt" 2>&1 || true
  sed 's/^/   nvidia-smi: /' "$LOGS/nvidia-smi.txt" | head -20
else
  echo "   nvidia-smi not found: is the NVIDIA driver installed? (the checks go on; airhost doctor will say)"
fi

# --- 1. build -------------------------------------------------------------------------------
if [ "${AIRHOST_GPU_CHECK_NO_SETUP:-0}" = 1 ]; then
  if [ -x "$AIRHOST" ]; then
    record build SKIP "no setup: using $AIRHOST ($("$AIRHOST" --version 2>&1))"
  else
    record build FAIL "no setup asked for, but $AIRHOST does not exist: run scripts/setup.sh"
  fi
else
  t0=$(date +%s)
  if scripts/setup.sh >"$LOGS/setup.log" 2>&1; then
    record build PASS "scripts/setup.sh in $(( $(date +%s) - t0 )) s: $("$AIRHOST" --version 2>&1)"
  else
    record build FAIL "scripts/setup.sh failed (exit $?); see $LOGS/setup.log: $(tail -n 1 "$LOGS/setup.log")"
  fi
fi

if [ ! -x "$AIRHOST" ] || [ ! -x "$PY" ]; then
  for step in torch doctor json ddp fsdp deepspeed; do record "$step" SKIP "no airhost build"; done
else
  # --- 2. torch -------------------------------------------------------------------------------
  torch_probe='import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())'
  probe=$("$PY" -c "$torch_probe" 2>&1 | tail -n 1)
  if [ "$(echo "$probe" | awk '{print $2}')" = None ] && [ -n "${AIRHOST_TORCH_INDEX_URL:-}" ]; then
    version=$(echo "$probe" | awk '{print $1}' | sed 's/+.*//')
    echo "   torch $probe is a CPU build: installing torch==$version from $AIRHOST_TORCH_INDEX_URL"
    "$PY" -m pip install -q --force-reinstall "torch==$version" --index-url "$AIRHOST_TORCH_INDEX_URL" \
      >"$LOGS/torch-install.log" 2>&1 || echo "   torch install failed; see $LOGS/torch-install.log"
    probe=$("$PY" -c "$torch_probe" 2>&1 | tail -n 1)
  fi
  echo "$probe" >"$LOGS/torch.txt"
  read -r t_version t_cuda t_available t_count <<<"$probe"
  if [ "${t_available:-}" = True ]; then
    record torch PASS "torch $t_version, CUDA $t_cuda, $t_count GPU(s) visible"
  elif [ "${t_cuda:-}" = None ]; then
    record torch FAIL "torch $t_version is a CPU build: install the CUDA build (see the top of this script)"
  else
    record torch FAIL "torch does not see a GPU: $probe"
  fi

  # --- 3. doctor ------------------------------------------------------------------------------
  t0=$(date +%s)
  timeout 150 "$AIRHOST" doctor >"$LOGS/doctor.txt" 2>&1
  rc=$?
  sed 's/^/   | /' "$LOGS/doctor.txt"
  last=$(grep '^airhost doctor:' "$LOGS/doctor.txt" | tail -n 1)
  if [ $rc = 0 ]; then
    record doctor PASS "exit 0 in $(( $(date +%s) - t0 )) s: ${last#airhost doctor: }"
  elif [ $rc = 124 ]; then
    record doctor FAIL "did not finish in 150 s (a hung CUDA or NCCL call?); see $LOGS/doctor.txt"
  else
    record doctor FAIL "exit $rc: ${last#airhost doctor: }"
  fi

  # --- 4. json --------------------------------------------------------------------------------
  timeout 150 "$AIRHOST" doctor --json >"$LOGS/doctor.json" 2>"$LOGS/doctor-json.stderr"
  rc=$?
  json_check='import json, sys
d = json.load(open(sys.argv[1]))
for k in ("exit_code", "gpus", "topology", "cuda_runtime", "nccl", "cublas", "allreduce"):
    assert k in d, "no key " + k
rows = d["allreduce"]["rows"]
assert d["allreduce"]["ran"] and rows, "no all-reduce ran: %s" % d["problems"]
assert all(r["wrong"] == 0 for r in rows), "wrong all-reduce sums"
print("%d GPU(s) %s, driver %s (CUDA %s), runtime %s, NCCL %s, cuBLAS %s; busbw %.1f GB/s at %d B" % (
    len(d["gpus"]), d["accelerator_type"] or "(no type)", d["driver_version"], d["cuda_driver_version"],
    d["cuda_runtime"]["version"], d["nccl"]["version"], d["cublas"]["version"] or "-",
    rows[-1]["busbw_gbps"], rows[-1]["size"]))'
  if summary=$("$PY" -c "$json_check" "$LOGS/doctor.json" 2>&1); then
    if [ $rc = 0 ]; then
      record json PASS "exit 0, valid: $summary"
    else
      record json FAIL "valid JSON but exit $rc: $summary"
    fi
  else
    record json FAIL "exit $rc, the JSON does not hold a passing all-reduce: $(echo "$summary" | tail -n 1)"
  fi

  # --- 5. ddp ---------------------------------------------------------------------------------
  t0=$(date +%s)
  (cd "$ROOT" && timeout 240 "$AIRHOST" examples/mlp_ddp.py --accelerators 1 --preflight \
      --env NCCL_DEBUG=INFO --run-dir "$LOGS/ddp-run-$(date +%Y%m%d-%H%M%S)") >"$LOGS/ddp.txt" 2>&1
  rc=$?
  grep -E 'preflight|epoch|final loss|NCCL version|Error|error' "$LOGS/ddp.txt" | head -20 | sed 's/^/   | /'
  nccl_line=$(grep -m 1 -o 'NCCL version [^ ]*' "$LOGS/ddp.txt")
  loss=$(grep -o 'final loss [0-9.]*' "$LOGS/ddp.txt" | tail -n 1)
  if [ $rc = 0 ] && [ -n "$nccl_line" ]; then
    record ddp PASS "exit 0 in $(( $(date +%s) - t0 )) s, $loss, $nccl_line"
  elif [ $rc = 0 ]; then
    record ddp FAIL "exit 0 ($loss) but no 'NCCL version' line: the rank did not use NCCL (CPU torch?)"
  elif [ $rc = 4 ]; then
    record ddp FAIL "--preflight refused the node: $(grep 'preflight:' "$LOGS/ddp.txt" | head -n 3 | tr '\n' ' ')"
  else
    record ddp FAIL "exit $rc ($loss); see $LOGS/ddp.txt"
  fi

  # --- 6. fsdp and 7. deepspeed ---------------------------------------------------------------
  # Two ranks where there are two GPUs, so that the weights are really sharded across GPUs and
  # NCCL carries the all-gathers and reduce-scatters; the examples' default 5 epochs bring
  # their loss below 0.05 at 1 or 2 ranks.
  case "${t_count:-}" in ''|*[!0-9]*) ranks=1 ;; *) ranks=$(( t_count >= 2 ? 2 : 1 )) ;; esac
  sharded_example() {  # sharded_example STEP SCRIPT: runs it, records PASS or FAIL
    local step=$1 example=$2 t0 rc nccl_line loss agree
    t0=$(date +%s)
    (cd "$ROOT" && timeout 240 "$AIRHOST" "$example" --accelerators "$ranks" --env NCCL_DEBUG=INFO \
        --run-dir "$LOGS/$step-run-$(date +%Y%m%d-%H%M%S)") >"$LOGS/$step.txt" 2>&1
    rc=$?
    grep -E 'epoch|final loss|weights sha256|DISAGREE|NCCL version|accelerator to|Error|error' "$LOGS/$step.txt" \
      | head -20 | sed 's/^/   | /'
    nccl_line=$(grep -m 1 -o 'NCCL version [^ ]*' "$LOGS/$step.txt")
    loss=$(grep -o 'final loss [0-9.]*' "$LOGS/$step.txt" | tail -n 1)
    agree=$(grep -o 'weights sha256 [0-9a-f]* on all [0-9]* ranks' "$LOGS/$step.txt" | tail -n 1)
    if [ $rc = 0 ] && [ -n "$nccl_line" ] && [ -n "$agree" ]; then
      record "$step" PASS "exit 0 in $(( $(date +%s) - t0 )) s on $ranks GPU(s), $loss, $agree, $nccl_line"
    elif [ $rc = 0 ]; then
      record "$step" FAIL "exit 0 ($loss) but no 'NCCL version' line: the ranks did not use NCCL (CPU torch?)"
    else
      record "$step" FAIL "exit $rc ($loss); see $LOGS/$step.txt"
    fi
  }
  sharded_example fsdp examples/fsdp.py

  if ! "$PY" -c "import deepspeed" >/dev/null 2>&1; then
    echo "   deepspeed is not installed in .venv: installing deepspeed==0.19.8"
    "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation "deepspeed==0.19.8" >"$LOGS/deepspeed-install.log" 2>&1 \
      || echo "   deepspeed install failed; see $LOGS/deepspeed-install.log"
  fi
  if "$PY" -c "import deepspeed" >/dev/null 2>&1; then
    sharded_example deepspeed examples/deepspeed_zero.py
  else
    record deepspeed FAIL "deepspeed is not importable in .venv; see $LOGS/deepspeed-install.log"
  fi
fi

# --- Summary ----------------------------------------------------------------------------------
echo
echo "== Summary ($(( $(date +%s) - started )) s)"
failed=0
for i in "${!names[@]}"; do
  printf '%-4s  %-9s %s\n' "${results[$i]}" "${names[$i]}" "${details[$i]}"
  [ "${results[$i]}" = FAIL ] && failed=1
done
if [ $failed = 0 ]; then
  echo "GPU CHECK: PASS"
else
  echo "GPU CHECK: FAIL (logs in $LOGS)"
fi
exit $failed

#!/usr/bin/env bash
# gpu-check.sh — the checks that need a real NVIDIA GPU, in one go, with a PASS/FAIL/SKIP line
# per step and a summary. Two ways to build what it checks:
#
#   online   scripts/gpu-check.sh: scripts/setup.sh (apt packages, .venv, torch from PyPI)
#   offline  AIRHOST_GPU_BUNDLE=DIR scripts/gpu-check.sh, DIR made by scripts/gpu-bundle.sh on
#            a machine with registries: installs nothing from anywhere. airhost is built
#            against the node's own python3 (AIRHOST_GPU_CHECK_NODE_PYTHON to name another)
#            and the torch it already has (torch 2.x with CUDA), with every core, into a venv
#            of its own (AIRHOST_GPU_CHECK_VENV, default build/gpu-check-venv) that sees the
#            node's packages through a .pth file and leaves the node's environment untouched;
#            CMake's build tree: AIRHOST_GPU_CHECK_BUILD_DIR (default build/gpu-check-build).
#
# AIRHOST_GPU_CHECK_BUILD_ONLY=1 stops after the build (the other steps SKIP).
# AIRHOST_GPU_CHECK_REHEARSAL=1 rehearses on a machine without a GPU: the steps that need one
# are SKIP, the others run (the build, the Python API and the CLI on CPU ranks, a warm start).
# Without it a missing GPU is a FAIL. The steps:
#
#   build     online: scripts/setup.sh; offline: a venv over the node's Python, and the
#             bundle's airhost wheel for that Python installed into it (no build); where the
#             bundle has none (or AIRHOST_GPU_CHECK_FROM_SOURCE=1), pip install . with the
#             bundle's libuv and toml++ (no pkg-config, no libuv needed on the node)
#   torch     torch is a CUDA build and sees the GPU(s)
#   doctor    `airhost doctor`: GPUs, topology, CUDA memory and SGEMM, NCCL all-reduce; exit 0
#   json      `airhost doctor --json`: one valid JSON object, exit 0, the all-reduce ran
#   api       the docs' MLP example (examples/notebook.ipynb) through @distributed, with the
#             node's accelerator_type on a GPU node (NCCL), 2 gloo ranks without one
#   type      a wrong accelerator_type is refused before anything starts, naming both models
#   ddp       `airhost examples/mlp_ddp.py`: 1 rank per GPU over NCCL (2 CPU ranks without)
#   fsdp      `airhost examples/fsdp.py`: FSDP2 on a CUDA mesh over NCCL
#   deepspeed `airhost examples/deepspeed_zero.py`: ZeRO-3 over NCCL (offline: the bundle's
#             DeepSpeed wheel is installed into the check's venv when the node lacks it)
#   warm      `airhost warm start --preload torch`, then a forked rank finds CUDA not yet
#             initialised and runs a matmul on the GPU
#   startup   cold start-up to the line after `import torch`, 4 ranks, against torchrun on this
#             node (bench/launch.py --only startup)
#   hang      an NCCL all-reduce one rank never enters, ended by --timeout: the stacks, NCCL's
#             flight recorder dumped through airhost's pipe, and the summary naming rank 1
#   usage     ranks busy on their GPUs for 12 s: metrics/ranks.jsonl gives each rank its own
#             GPU, with the memory it holds and its utilisation, read by the host from NVML
#
# Output: a summary on stdout; every step's full output in $AIRHOST_GPU_CHECK_LOGS (default
# build/gpu-check/). Exit status: 0 when no step FAILed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
LOGS=${AIRHOST_GPU_CHECK_LOGS:-$ROOT/build/gpu-check}
mkdir -p "$LOGS"
BUNDLE=${AIRHOST_GPU_BUNDLE:-}
REHEARSAL=${AIRHOST_GPU_CHECK_REHEARSAL:-0}
export AIRHOST_GPU_CHECK_REHEARSAL=$REHEARSAL
NPROC=$(nproc 2>/dev/null || echo 2)
if [ -n "$BUNDLE" ]; then
  BUNDLE=$(cd "$BUNDLE" 2>/dev/null && pwd) || { echo "AIRHOST_GPU_BUNDLE=${AIRHOST_GPU_BUNDLE}: no such directory (make it with scripts/gpu-bundle.sh DIR)" >&2; exit 2; }
  [ -f "$BUNDLE/MANIFEST" ] || { echo "AIRHOST_GPU_BUNDLE=$BUNDLE holds no MANIFEST: make it with scripts/gpu-bundle.sh $BUNDLE" >&2; exit 2; }
  NODE_PY=${AIRHOST_GPU_CHECK_NODE_PYTHON:-python3}
  NODE_PY=$(command -v "$NODE_PY") || { echo "no python3 on PATH: name the node's Python in AIRHOST_GPU_CHECK_NODE_PYTHON" >&2; exit 2; }
  VENV=${AIRHOST_GPU_CHECK_VENV:-$ROOT/build/gpu-check-venv}
  PY=$VENV/bin/python
  AIRHOST=$VENV/bin/airhost
else
  # Another build to check (a cmake build tree's airhost, say): AIRHOST_GPU_CHECK_BIN, with the
  # interpreter whose torch its ranks use in AIRHOST_GPU_CHECK_PYTHON; setup is then skipped.
  PY=${AIRHOST_GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python}
  AIRHOST=${AIRHOST_GPU_CHECK_BIN:-$ROOT/.venv/bin/airhost}
  [ -n "${AIRHOST_GPU_CHECK_BIN:-}" ] && AIRHOST_GPU_CHECK_NO_SETUP=1
  NODE_PY=$PY
fi

names=()
results=()
details=()
record() {  # record NAME PASS|FAIL|SKIP DETAIL
  names+=("$1")
  results+=("$2")
  details+=("$3")
  printf '%-9s %-4s %s\n' "$1" "$2" "$3"
}
needs_gpu() {  # needs_gpu STEP...: true when there is a GPU to run them on; else (a rehearsal) SKIPs them
  [ "${have_gpu:-0}" = 1 ] && return 0
  for s in "$@"; do record "$s" SKIP "needs a GPU (rehearsal)"; done
  return 1
}
started=$(date +%s)

# --- What this node has, before anything is built --------------------------------------------
echo "== airhost GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), $NPROC cores, logs in $LOGS)"
[ -n "$BUNDLE" ] && echo "   bundle:   $BUNDLE ($(tail -n 1 "$BUNDLE/MANIFEST"))"
"$NODE_PY" - >"$LOGS/found.txt" 2>&1 <<'EOF'
import os, sys, sysconfig
v = sysconfig.get_config_var
lib = os.path.join(v("LIBDIR") or "", v("LDLIBRARY") or "")
shared = bool(v("Py_ENABLE_SHARED"))
headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print(f"python:   {sys.version.split()[0]} at {sys.executable}; shared libpython: "
      f"{'yes, ' + lib if shared else 'NO (built without --enable-shared): airhost cannot embed it'}; "
      f"headers: {'yes' if headers else 'NO (install python3-dev)'}")
try:
    import torch
    cuda = torch.version.cuda
    line = f"torch:    {torch.__version__} at {os.path.dirname(torch.__file__)}, built for CUDA {cuda}"
    if cuda:
        line += f", cuDNN {torch.backends.cudnn.version()}"
    print(line)
    if cuda and torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        print(f"cuda:     runtime {cuda} (torch's), NCCL {nccl} (torch's), "
              f"{len(names)} GPU(s): {', '.join(names)}")
    elif cuda:
        print("cuda:     torch sees no GPU (torch.cuda.is_available() is False)")
except Exception as e:
    print(f"torch:    not importable: {type(e).__name__}: {e}")
EOF
sed 's/^/   /' "$LOGS/found.txt"
echo "   compiler: $( (${CXX:-c++} --version 2>/dev/null || echo 'none (c++ not found)') | head -n 1)"
echo "   cmake:    $( (cmake --version 2>/dev/null || "$NODE_PY" -m cmake --version 2>/dev/null || echo 'not found') | head -n 1); ninja $(ninja --version 2>/dev/null || echo 'not found'); pkg-config $(pkg-config --version 2>/dev/null || echo 'not found')"
echo "   nvcc:     $( (nvcc --version 2>/dev/null | tail -n 2 | head -n 1) || true)$(command -v nvcc >/dev/null || echo 'not found')"
have_gpu=0
gpu_why=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >"$LOGS/nvidia-smi.txt" 2>&1 || true
  nvidia-smi topo -m >>"$LOGS/nvidia-smi.txt" 2>&1 || true
  echo "   driver:   $(nvidia-smi 2>/dev/null | grep -o 'Driver Version: [0-9.]*  *CUDA Version: [0-9.]*' | tr -s ' ')"
  sed 's/^/   nvidia-smi: /' "$LOGS/nvidia-smi.txt" | head -12
else
  echo "   driver:   nvidia-smi not found (no NVIDIA driver here?)"
  gpu_why="nvidia-smi not found"
fi
grep -q '^cuda:     runtime' "$LOGS/found.txt" && have_gpu=1
[ $have_gpu = 1 ] || gpu_why=${gpu_why:-$(grep -E '^(torch|cuda):' "$LOGS/found.txt" | tail -n 1)}

# --- 1. build ---------------------------------------------------------------------------------
make_venv() {
  # A venv over the node's Python: its own site-packages first (airhost, and the bundle's
  # wheels), then the node's through a .pth file, so torch and the build tools are the node's.
  local node_site
  node_site=$("$NODE_PY" -c 'import site, sys; print("\n".join(p for p in site.getsitepackages() if "-packages" in p))')
  if [ ! -x "$PY" ]; then
    "$NODE_PY" -m venv --without-pip "$VENV" || return 1
  fi
  local venv_site
  venv_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  : >"$venv_site/_airhost_node_site.pth"
  while read -r d; do
    [ -n "$d" ] && echo "import site; site.addsitedir('$d')" >>"$venv_site/_airhost_node_site.pth"
  done <<<"$node_site"
}
build_offline() {
  [ -x "$PY" ] || make_venv || return 1
  "$PY" -c 'import pip, scikit_build_core, pybind11' || {
    echo "the node's Python lacks pip, scikit-build-core or pybind11, which the offline build uses" >&2; return 1; }
  local pybind11_dir
  pybind11_dir=$("$PY" -m pybind11 --cmakedir)
  # No pkg-config and no system libuv or toml++ needed: the bundle's, named to CMake.
  CMAKE_BUILD_PARALLEL_LEVEL=$NPROC PKG_CONFIG=/nonexistent-pkg-config \
  CMAKE_ARGS="-DAIRHOST_LIBUV_DIR=$BUNDLE/libuv -DAIRHOST_TOMLPP_INCLUDE=$BUNDLE/include -Dpybind11_DIR=$pybind11_dir" \
    "$PY" -m pip install -v --no-index --no-build-isolation --no-deps --disable-pip-version-check \
      --config-settings=build-dir="${AIRHOST_GPU_CHECK_BUILD_DIR:-$ROOT/build/gpu-check-build}" --config-settings=build.tool-args=-k0 "$ROOT" || return 1
  [ -x "$AIRHOST" ] || { echo "pip install . left no $AIRHOST" >&2; return 1; }
}
# The wheel of the node's Python from the bundle, installed with no build: what a user does.
install_wheel() {
  local wheel=$1
  # Into the check's own venv even when the node's environment has an airhost of the same
  # version (the venv sees the node's packages): --force-reinstall, its needs only if missing.
  "$PY" -m pip install --no-index --disable-pip-version-check --force-reinstall --no-deps "$wheel" || return 1
  "$PY" -c 'import cloudpickle, fsspec' 2>/dev/null \
    || "$PY" -m pip install --no-index --disable-pip-version-check --find-links "$BUNDLE/wheels" cloudpickle fsspec || return 1
  [ -x "$AIRHOST" ] || { echo "pip install $wheel left no $AIRHOST" >&2; return 1; }
}
if [ -n "$BUNDLE" ]; then
  t0=$(date +%s)
  node_tag=$("$NODE_PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheel=$(ls "$BUNDLE"/wheels/airhost-*-"$node_tag"-"$node_tag"-manylinux_*.whl 2>/dev/null | head -n 1)
  [ "${AIRHOST_GPU_CHECK_FROM_SOURCE:-0}" = 1 ] && wheel=""
  [ -n "$wheel" ] && { [ -x "$PY" ] || make_venv >"$LOGS/build.log" 2>&1; }
fi
if [ -n "$BUNDLE" ] && [ -n "$wheel" ] && install_wheel "$wheel" >>"$LOGS/build.log" 2>&1; then
  record build PASS "wheel $(basename "$wheel") installed in $(( $(date +%s) - t0 )) s, no build: $("$AIRHOST" --version 2>&1)"
elif [ -n "$BUNDLE" ]; then
  t0=$(date +%s)
  if [ -n "$wheel" ]; then why="the wheel did not install (see $LOGS/build.log), so"; else why="no wheel for $node_tag in the bundle (or AIRHOST_GPU_CHECK_FROM_SOURCE=1), so"; fi
  if build_offline >>"$LOGS/build.log" 2>&1; then
    uv_line=$(grep -o 'airhost: libuv from [^ ]*: [^ ]*' "$LOGS/build.log" | tail -n 1)
    toml_line=$(grep -o 'airhost: toml++ from [^ ]*' "$LOGS/build.log" | tail -n 1)
    record build PASS "$why built offline in $(( $(date +%s) - t0 )) s on $NPROC cores: $("$AIRHOST" --version 2>&1); ${uv_line#airhost: }; ${toml_line#airhost: }"
  else
    record build FAIL "offline build failed; see $LOGS/build.log: $(grep -m 1 -E 'Error|error:|FATAL' "$LOGS/build.log" || tail -n 1 "$LOGS/build.log")"
  fi
elif [ "${AIRHOST_GPU_CHECK_NO_SETUP:-0}" = 1 ]; then
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

run_dir() { echo "$LOGS/$1-run-$(date +%Y%m%d-%H%M%S)"; }
all_steps=(torch doctor json api type ddp fsdp deepspeed warm startup hang usage)
if [ ! -x "$AIRHOST" ] || [ ! -x "$PY" ]; then
  for step in "${all_steps[@]}"; do record "$step" SKIP "no airhost build"; done
elif [ "${AIRHOST_GPU_CHECK_BUILD_ONLY:-0}" = 1 ]; then
  for step in "${all_steps[@]}"; do record "$step" SKIP "AIRHOST_GPU_CHECK_BUILD_ONLY=1"; done
elif [ $have_gpu = 0 ] && [ "$REHEARSAL" != 1 ]; then
  # On a GPU node whose GPU is missing (a container started without --gpus, a broken driver),
  # CPU ranks passing would prove nothing of what this check is for.
  for step in "${all_steps[@]}"; do
    record "$step" FAIL "no GPU: ${gpu_why:-torch sees none} (AIRHOST_GPU_CHECK_REHEARSAL=1 rehearses without one)"
  done
else
  # --- 2. torch ---------------------------------------------------------------------------------
  probe=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())' 2>&1 | tail -n 1)
  echo "$probe" >"$LOGS/torch.txt"
  read -r t_version t_cuda t_available t_count <<<"$probe"
  if [ "${t_available:-}" = True ]; then
    record torch PASS "torch $t_version, CUDA $t_cuda, $t_count GPU(s) visible to the ranks' interpreter"
  elif needs_gpu torch; then
    record torch FAIL "torch does not see a GPU: $probe"
  fi
  case "${t_count:-}" in ''|*[!0-9]*) t_count=0 ;; esac

  # --- 3. doctor, 4. json ---------------------------------------------------------------------
  if needs_gpu doctor json; then
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
      if [ $rc = 0 ]; then record json PASS "exit 0, valid: $summary"; else record json FAIL "valid JSON but exit $rc: $summary"; fi
    else
      record json FAIL "exit $rc, the JSON does not hold a passing all-reduce: $(echo "$summary" | tail -n 1)"
    fi
  fi

  # --- 5. api, 6. type: the docs' example through the Python API --------------------------------
  t0=$(date +%s)
  (cd "$LOGS" && AIRHOST_RUNS_DIR="$LOGS/api-runs" timeout 300 "$PY" "$ROOT/scripts/gpu_check/api_example.py") \
    >"$LOGS/api.txt" 2>&1
  rc=$?
  grep -E '^(node:|\[rank 0\])' "$LOGS/api.txt" | head -12 | sed 's/^/   | /'
  api_line=$(grep '^api: ' "$LOGS/api.txt" | tail -n 1)
  if [ -n "$api_line" ]; then
    api_line=${api_line#api: }
    record api "${api_line%% *}" "${api_line#* }"
  else
    record api FAIL "exit $rc with no verdict; see $LOGS/api.txt: $(tail -n 1 "$LOGS/api.txt")"
  fi
  if needs_gpu type; then
    type_line=$(grep '^type: ' "$LOGS/api.txt" | tail -n 1)
    if [ -n "$type_line" ]; then type_line=${type_line#type: }; record type "${type_line%% *}" "${type_line#* }"
    else record type FAIL "no verdict; see $LOGS/api.txt"; fi
  fi

  # --- 7. ddp -----------------------------------------------------------------------------------
  ranks=$(( t_count >= 2 ? 2 : 1 ))
  if [ $have_gpu = 1 ]; then
    t0=$(date +%s)
    (cd "$ROOT" && timeout 240 "$AIRHOST" examples/mlp_ddp.py --accelerators "$t_count" --preflight \
        --env NCCL_DEBUG=INFO --run-dir "$(run_dir ddp)") >"$LOGS/ddp.txt" 2>&1
    rc=$?
    grep -E 'preflight|epoch|final loss|NCCL version|Error|error' "$LOGS/ddp.txt" | head -20 | sed 's/^/   | /'
    nccl_line=$(grep -m 1 -o 'NCCL version [^ ]*' "$LOGS/ddp.txt")
    loss=$(grep -o 'final loss [0-9.]*' "$LOGS/ddp.txt" | tail -n 1)
    if [ $rc = 0 ] && [ -n "$nccl_line" ]; then
      record ddp PASS "exit 0 in $(( $(date +%s) - t0 )) s on $t_count GPU(s), $loss, $nccl_line"
    elif [ $rc = 0 ]; then
      record ddp FAIL "exit 0 ($loss) but no 'NCCL version' line: the rank did not use NCCL (CPU torch?)"
    elif [ $rc = 4 ]; then
      record ddp FAIL "--preflight refused the node: $(grep 'preflight:' "$LOGS/ddp.txt" | head -n 3 | tr '\n' ' ')"
    else
      record ddp FAIL "exit $rc ($loss); see $LOGS/ddp.txt"
    fi
  else
    # No GPU: the same example through the CLI on 2 CPU ranks (gloo), which needs none.
    t0=$(date +%s)
    (cd "$ROOT" && timeout 240 "$AIRHOST" examples/mlp_ddp.py --accelerators 2 --run-dir "$(run_dir ddp)") >"$LOGS/ddp.txt" 2>&1
    rc=$?
    loss=$(grep -o 'final loss [0-9.]*' "$LOGS/ddp.txt" | tail -n 1)
    if [ $rc = 0 ] && [ -n "$loss" ]; then record ddp PASS "exit 0 in $(( $(date +%s) - t0 )) s on 2 CPU ranks (gloo; no GPU here), $loss"
    else record ddp FAIL "exit $rc ($loss); see $LOGS/ddp.txt"; fi
  fi

  # --- 8. fsdp and 9. deepspeed -------------------------------------------------------------
  # Two ranks where there are two GPUs, so that the weights are really sharded across GPUs and
  # NCCL carries the all-gathers and reduce-scatters; the examples' default 5 epochs bring
  # their loss below 0.05 at 1 or 2 ranks.
  sharded_example() {  # sharded_example STEP SCRIPT: runs it, records PASS or FAIL
    local step=$1 example=$2 t0 rc nccl_line loss agree
    t0=$(date +%s)
    (cd "$ROOT" && timeout 240 "$AIRHOST" "$example" --accelerators "$ranks" --env NCCL_DEBUG=INFO \
        --run-dir "$(run_dir "$step")") >"$LOGS/$step.txt" 2>&1
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
  if needs_gpu fsdp; then sharded_example fsdp examples/fsdp.py; fi

  if needs_gpu deepspeed; then
    if ! "$PY" -c "import deepspeed" >/dev/null 2>&1; then
      if [ -n "$BUNDLE" ] && ls "$BUNDLE"/wheels/deepspeed-*.whl >/dev/null 2>&1; then
        echo "   deepspeed is not installed: installing the bundle's wheels into $VENV"
        "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --find-links "$BUNDLE/wheels" \
          deepspeed hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions \
          >"$LOGS/deepspeed-install.log" 2>&1 || echo "   deepspeed install failed; see $LOGS/deepspeed-install.log"
      elif [ -z "$BUNDLE" ]; then
        echo "   deepspeed is not installed in .venv: installing deepspeed==0.19.8"
        "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation "deepspeed==0.19.8" >"$LOGS/deepspeed-install.log" 2>&1 \
          || echo "   deepspeed install failed; see $LOGS/deepspeed-install.log"
      fi
    fi
    if "$PY" -c "import deepspeed" >"$LOGS/deepspeed-import.log" 2>&1; then
      sharded_example deepspeed examples/deepspeed_zero.py
    elif [ -n "$BUNDLE" ] && ! ls "$BUNDLE"/wheels/deepspeed-*.whl >/dev/null 2>&1; then
      record deepspeed SKIP "no DeepSpeed on the node and none in the bundle (AIRHOST_BUNDLE_DEEPSPEED=0?)"
    else
      record deepspeed FAIL "deepspeed is not importable: $(tail -n 1 "$LOGS/deepspeed-import.log")"
    fi
  fi

  # --- 10. warm: a rank forked from a server that preloaded torch uses the GPU ---------------
  t0=$(date +%s)
  state=$(mktemp -d)
  warm_env=(env AIRHOST_STATE_DIR="$state" AIRHOST_RUNS_DIR="$LOGS/warm-runs")
  if "${warm_env[@]}" timeout 120 "$AIRHOST" warm start --preload torch >"$LOGS/warm.txt" 2>&1; then
    (cd "$ROOT" && "${warm_env[@]}" timeout 120 "$AIRHOST" scripts/gpu_check/warm_cuda.py \
        --accelerators "$(( t_count >= 1 ? t_count : 2 ))") >>"$LOGS/warm.txt" 2>&1
    rc=$?
    forked=$(grep -c 'warm start (server pid' "$LOGS/warm.txt")
    used=$(grep 'warm-cuda: rank 0' "$LOGS/warm.txt" | head -n 1 | sed 's/.*warm-cuda: //')
    if [ $rc = 0 ] && [ "$forked" -ge 1 ] && [ $have_gpu = 1 ] && [ -n "$used" ]; then
      record warm PASS "exit 0 in $(( $(date +%s) - t0 )) s, ranks forked by the warm server: $used"
    elif [ $rc = 0 ] && [ "$forked" -ge 1 ] && [ "$REHEARSAL" = 1 ]; then
      record warm PASS "exit 0, ranks forked by the warm server (no GPU here: the CUDA part is not shown)"
    else
      record warm FAIL "exit $rc (forked by the server: $([ "$forked" -ge 1 ] && echo yes || echo no)); see $LOGS/warm.txt"
    fi
  else
    record warm FAIL "airhost warm start failed; see $LOGS/warm.txt: $(tail -n 1 "$LOGS/warm.txt")"
  fi
  AIRHOST_STATE_DIR="$state" timeout 30 "$AIRHOST" warm stop >/dev/null 2>&1
  rm -rf "$state"
  sed 's/^/   | /' "$LOGS/warm.txt" | grep -E 'warm|error|Error' | head -8

  # --- 11. startup: cold start-up against torchrun on this node -------------------------------
  if needs_gpu startup; then
    torchrun=$(dirname "$NODE_PY")/torchrun
    [ -x "$torchrun" ] || torchrun=$(command -v torchrun || true)
    accel=$(dirname "$NODE_PY")/accelerate
    [ -x "$accel" ] || accel=$(command -v accelerate || echo /nonexistent)
    if [ -z "$torchrun" ]; then
      record startup SKIP "no torchrun next to $NODE_PY or on PATH"
    else
      t0=$(date +%s)
      timeout 240 "$PY" bench/launch.py --only startup --startup-ranks 4 --repeats 2 --airhost "$AIRHOST" \
        --torchrun "$torchrun" --accelerate "$accel" --python "$PY" --json-file "$LOGS/startup.json" \
        >"$LOGS/startup.txt" 2>&1
      rc=$?
      figures=$("$PY" - "$LOGS/startup.json" <<'EOF' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))["startup"]["by_ranks"]["4"]
r = lambda k: d[k]["ready"]["median"] if k in d and d[k].get("ready") else None
tr = r("torchrun")
parts = []
for k, label in (("airhost_cold_no_tracking", "cold"), ("airhost_warm", "warm")):
    if r(k) is not None:
        parts.append(f"airhost {label} {r(k):.2f} s = {r(k) / tr:.3f}x")
print(f"4 ranks to the line after import torch: torchrun {tr:.2f} s; " + ", ".join(parts))
EOF
)
      if [ $rc = 0 ] && [[ "$figures" == "4 ranks"* ]]; then
        record startup PASS "in $(( $(date +%s) - t0 )) s: $figures"
      else
        record startup FAIL "exit $rc: $(echo "$figures" | tail -n 1); see $LOGS/startup.txt"
      fi
    fi
  fi

  # --- 12. hang: an NCCL collective one rank never enters ----------------------------------------
  if needs_gpu hang; then
    if [ "$t_count" -lt 2 ]; then
      record hang SKIP "needs 2 GPUs (NCCL between ranks); $t_count here"
    else
      t0=$(date +%s)
      dir=$(run_dir hang)
      (cd "$ROOT" && timeout 200 "$AIRHOST" scripts/gpu_check/nccl_hang.py --accelerators 2 --timeout 60 \
        --run-dir "$dir") >"$LOGS/hang.txt" 2>&1
      rc=$?
      grep -E 'timeout|flight recorder|never entered|disagree|rank [0-9]+ .*is in|are in' "$LOGS/hang.txt" | head -12 | sed 's/^/   | /'
      dumps=$(ls "$dir"/stacks/nccl-trace-rank-[0-9]* 2>/dev/null | wc -l)
      named=$(grep -m 1 -o 'rank 1 never entered collective #[0-9]* ([^)]*)' "$LOGS/hang.txt")
      if [ $rc = 124 ] && [ -n "$named" ]; then
        record hang PASS "exit 124 in $(( $(date +%s) - t0 )) s; $dumps flight recorder dump(s); summary: $named"
      else
        record hang FAIL "exit $rc, $dumps flight recorder dump(s), no rank named in the summary; see $LOGS/hang.txt and $dir/stacks"
      fi
    fi
  fi

  # --- 13. usage: each rank's GPU, its memory and utilisation, sampled by the host --------------------
  if needs_gpu usage; then
    t0=$(date +%s)
    dir=$(run_dir usage)
    (cd "$ROOT" && timeout 120 "$AIRHOST" scripts/gpu_check/gpu_busy.py --accelerators "$t_count" --run-dir "$dir" -- 12) \
      >"$LOGS/usage.txt" 2>&1
    rc=$?
    # Per rank, its last sample: "rank R: GPU G U% M MiB"; the step passes when every rank has its own GPU
    # (no two the same), at least the 2 GiB it holds, and a utilisation over 0.
    verdict=$("$PY" - "$dir/metrics/ranks.jsonl" "$t_count" <<'PY'
import json, sys
last = {}
for line in open(sys.argv[1]):
    u = json.loads(line)
    last[u["rank"]] = u
ok = len(last) == int(sys.argv[2]) and all("gpu" in u for u in last.values())
ok = ok and len({u["gpu"] for u in last.values()}) == len(last)
ok = ok and all(u["gpu_memory_bytes"] >= 2 << 30 and (u["gpu_util_percent"] or 0) > 0 for u in last.values())
print(("ok " if ok else "bad ") + "; ".join(
    f"rank {r}: GPU {u.get('gpu')} {u.get('gpu_util_percent')}% {u.get('gpu_memory_bytes', 0) >> 20} MiB" for r, u in sorted(last.items())))
PY
    ) 2>>"$LOGS/usage.txt"
    if [ $rc = 0 ] && [ "${verdict%% *}" = ok ]; then
      record usage PASS "exit 0 in $(( $(date +%s) - t0 )) s; ${verdict#ok }"
    else
      record usage FAIL "exit $rc; ${verdict:-no metrics/ranks.jsonl}; see $LOGS/usage.txt and $dir/metrics"
    fi
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
  echo "GPU CHECK: PASS$([ "$REHEARSAL" = 1 ] && echo ' (rehearsal: the GPU steps were skipped)')"
else
  echo "GPU CHECK: FAIL (logs in $LOGS)"
fi
exit $failed

#!/usr/bin/env bash
# test.sh — every test: the doctest suite (C++), the fuzz targets, the sanitizers, the sdist and
# the four wheels, the whole pytest suite (end to end, real torch/gloo), then the performance
# guard. CI runs exactly this (.ci/run). docs/testing.md says what each part checks and when to
# run which.
#
#   scripts/test.sh                 everything, as CI does (set-up included)
#   scripts/test.sh --quick         the inner loop: an incremental build, the doctest suite and
#                                   an end-to-end slice through every room (~1 min after an edit)
#   scripts/test.sh [PYTEST ARGS]   everything, with these arguments for the pytest suite
#                                   (-k EXPR, a file, -x ...)
#
# Where the minutes go: the compiles that nothing in the pytest suite needs (the fuzz targets,
# the ASan and TSan trees, the wheels) run in the background at the lowest CPU priority while
# the pytest suite, which mostly waits on processes, runs in the foreground; what uses those
# builds runs once they are done. A table at the end says how long each part took (also in
# build/test-logs/phases.txt), and pytest lists its slowest tests.
# AIRHOST_TEST_FUZZ=0, AIRHOST_TEST_SANITIZE=0, AIRHOST_TEST_WHEELS=0 (and with it the
# containers), AIRHOST_TEST_CONTAINERS=0 and AIRHOST_TEST_GUARD=0 skip a part.
# AIRHOST_TEST_WORKERS=N runs the pytest suite in N pytest-xdist workers (default 3, a file per
# worker, the longest files first: most tests wait on processes, so 3 workers keep 2 cores
# busy; 1 runs it in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOGS=$ROOT/build/test-logs
mkdir -p "$LOGS"
quick=0
if [ "${1:-}" = --quick ]; then quick=1; shift; fi
PY=$ROOT/.venv/bin/python
WORKERS=${AIRHOST_TEST_WORKERS:-3}
QUICK_WORKERS=$(( $(nproc) * 3 / 2 > 1 ? $(nproc) * 3 / 2 : 2 ))

# --- the phase table ----------------------------------------------------------------------------
TABLE=$LOGS/phases.txt
: >"$TABLE"
: >"$LOGS/background-steps.txt"  # this run's alone (--quick has none)
T_START=$(date +%s)
now() { date +%s; }
# CPU seconds (user and system) of this shell's finished children so far, into CPU: on 2 cores
# the minutes of CI are CPU, so the table says how much of it each part used. (`times` in this
# shell itself: in a $(...) it would count the subshell's children.)
cpu_now() {
  local f=$LOGS/.times.$BASHPID
  times >"$f"
  CPU=$(awk 'END { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d", s }' "$f")
  rm -f "$f"
}
# row NAME T0 CPU0 RC [NOTE]: one line of the table.
row() {
  cpu_now
  printf '%-34s %5d s %6d CPU-s%s%s\n' "$1" "$(( $(now) - $2 ))" "$(( CPU - $3 ))" "${5:+ $5}" \
    "$([ "$4" = 0 ] || echo "  FAILED (exit $4)")"
}
# phase_into TABLE NAME CMD...: runs CMD and notes in TABLE how long it took, and its CPU.
phase_into() {
  local table=$1 name=$2 t0 c0 rc=0
  shift 2
  t0=$(now); cpu_now; c0=$CPU
  echo "test.sh: ${name#  }" >&2
  "$@" || rc=$?
  row "$name" "$t0" "$c0" $rc >>"$table"
  return $rc
}
# phase NAME CMD...: a part run in the foreground, in the main table.
phase() { phase_into "$TABLE" "$@"; }
# background [--beside] NAME CMD...: runs CMD behind the foreground at the lowest CPU and I/O
# priority (--beside: at the foreground's own, for a part that mostly waits), its output in
# build/test-logs/NAME.log; settle NAME waits for it and fails as it did.
declare -A BG_PID
background() {
  local beside=0
  if [ "$1" = --beside ]; then beside=1; shift; fi
  local name=$1
  shift
  echo "test.sh: $name ($([ $beside = 1 ] && echo "beside the foreground" || echo "in the background"), build/test-logs/$name.log)" >&2
  ( t0=$(now); cpu_now; c0=$CPU; rc=0
    if [ $beside = 0 ]; then renice -n 19 -p $BASHPID >/dev/null; ionice -c 3 -p $BASHPID 2>/dev/null || true; fi
    "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    row "$name" "$t0" "$c0" $rc "$([ $beside = 1 ] && echo "(beside)" || echo "(background)")" >>"$TABLE"
    exit $rc ) &
  BG_PID[$name]=$!
}
# wait_for FILE: until the foreground has written FILE (the background's steps that need .venv).
wait_for() { while [ ! -e "$1" ]; do sleep 2; done; }
settle() {
  local name=$1 rc=0
  wait "${BG_PID[$name]}" || rc=$?
  unset "BG_PID[$name]"
  if [ $rc != 0 ]; then
    tail -n 80 "$LOGS/$name.log" >&2
    echo "test.sh: $name failed (exit $rc); its whole output is in build/test-logs/$name.log" >&2
    return $rc
  fi
}
# stop_tree PID: stops PID and every process under it (a background part's compilers and
# tests, which a kill of its subshell alone would leave running after a failed run).
stop_tree() {
  local pid=$1 child
  kill -STOP "$pid" 2>/dev/null || return 0  # frozen first: it starts no new child meanwhile
  for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do stop_tree "$child"; done
  kill -TERM "$pid" 2>/dev/null || true
  kill -CONT "$pid" 2>/dev/null || true
}
finish() {
  local rc=$?
  for pid in "${BG_PID[@]}"; do stop_tree "$pid"; done
  row total "$T_START" 0 $rc >>"$TABLE"
  echo "--- test.sh: where the time went ---" >&2
  cat "$TABLE" >&2
  if [ -s "$LOGS/background-steps.txt" ]; then echo "of which in the background:" >&2; cat "$LOGS/background-steps.txt" >&2; fi
}
trap finish EXIT

build_dev() {
  # The C++ tests and the test helpers (the fake NVML) build in their own tree; ccache, where
  # it is installed, makes a rebuild after switching branches cheap.
  # Under CI (a fresh clone, built once) its sources compile in batches (AIRHOST_UNITY_BUILD).
  local extra=()
  command -v ccache >/dev/null && extra=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  [ -n "${CI:-}" ] && extra+=(-DAIRHOST_UNITY_BUILD=ON)
  if [ ! -f build/dev/build.ninja ]; then
    cmake -S . -B build/dev -G Ninja -DAIRHOST_BUILD_PYTHON=OFF -DPython3_EXECUTABLE="$PY" \
      -DAIRHOST_GPU_SDK="$ROOT/build/gpu-sdk" "${extra[@]}" >/dev/null || return $?
  fi
  cmake --build build/dev -j "$(nproc)"
}
export AIRHOST_TEST_BUILD_DIR=$ROOT/build/dev

if [ $quick = 1 ]; then
  # --- the quick tier: no set-up, no sanitizer, no wheel; the tree must have been built once --
  [ -x "$PY" ] && [ -d build/gpu-sdk ] || { echo "test.sh --quick: run scripts/test.sh once first (it sets up .venv and build/)" >&2; exit 2; }
  phase "build (incremental)" build_dev
  # The doctest suite mostly waits: beside the slice.
  background --beside "doctest suite" build/dev/airhost_tests --no-version=true --minimal=true
  # One end-to-end test or a few per room, with build/dev's airhost (the one just built): a
  # launch and its output, a failure, a warm launch, two nodes (a failure and a lost node),
  # four nodes ending at once, the stacks, the Python API's call.
  QUICK=(
    tests/py/test_cli_e2e.py::test_script_arguments_after_the_double_dash_reach_sys_argv_exactly
    tests/py/test_cli_e2e.py::test_a_script_function_target_returns_each_ranks_value_in_results_pickles
    tests/py/test_failures.py
    tests/py/test_warm.py::test_a_warm_launch_forks_ranks_with_their_own_pid_group_env_and_logs
    tests/py/test_warm.py::test_a_failing_warm_rank_tears_the_group_down_and_leaves_no_process
    tests/py/test_multinode.py::test_two_nodes_form_one_world_of_four_ranks
    tests/py/test_multinode.py::test_a_rank_failing_on_node_1_stops_node_0_naming_node_and_rank
    tests/py/test_multinode.py::test_killing_node_1s_airhost_ends_node_0_at_once
    tests/py/test_multinode.py::test_every_host_ends_within_moments_of_a_failure_whatever_the_grace
    tests/py/test_stacks.py::test_stacks_name_the_rank_in_its_data_loading_first_and_the_others_all_reduce
    tests/py/test_stacks.py::test_stacks_on_node_0_show_every_rank_of_every_node_the_odd_one_on_node_1_first
  )
  phase "end-to-end slice" env AIRHOST_TEST_AIRHOST="$ROOT/build/dev/airhost" \
    "$PY" -m pytest -q -p no:cacheprovider -n "$QUICK_WORKERS" "${QUICK[@]}" "$@"
  phase "(waiting for the doctest suite)" settle "doctest suite"
  exit 0
fi

# --- everything ---------------------------------------------------------------------------------
# The system's packages and the vendored sources first: the background below starts with the
# wheels, which need nothing more, while the rest of the set-up and build/dev go on.
phase "set-up: system packages" env AIRHOST_SETUP_TEST_DEPS=1 AIRHOST_SETUP_ONLY=packages scripts/setup.sh
SETUP_DONE=$LOGS/set-up-done
rm -f "$SETUP_DONE"

# Behind the foreground, in two chains:
#  - the sdist and a wheel per CPython 3.10-3.13, as users install them: the GPU bundle's test
#    (test_gpu_offline.py) takes two of them from dist/ once WHEELS_READY says so; then
#    tests/py/test_wheels.py: the sdist and each wheel installed into a fresh venv with no
#    compiler in reach, and run (its own pytest session, its own temporary directory); then
#    tests/container/: deploy/Dockerfile's image built from the wheel with podman on a Debian
#    base (made meanwhile, once per machine) and run as users run it;
#  - once the wheels are built and .venv is there, every parser of outside bytes under
#    libFuzzer, AddressSanitizer and UBSan, from its corpus (tests/fuzz/), a fixed number of
#    runs from a fixed seed (the same inputs each time); then the ASan+UBSan and TSan trees of
#    scripts/sanitize.sh, built (it runs them further down).
# The container tests (tests/container/): where podman is (the set-up's system packages bring it).
CONTAINERS=0
[ "${AIRHOST_TEST_CONTAINERS:-1}" = 1 ] && command -v podman >/dev/null && CONTAINERS=1
WHEELS_READY=$LOGS/wheels-ready
rm -f "$WHEELS_READY"
# bg_step NAME CMD...: one step of the background, under it in the table.
bg_step() { local name=$1; shift; phase_into "$LOGS/background-steps.txt" "  $name" "$@"; }
# Two chains, side by side (at the end, when the foreground waits, each has a core):
bg_wheels() {
  local rc=0 base=""
  # The containers' Debian base (once per machine; mostly a download) while the wheels build.
  if [ "$CONTAINERS" = 1 ]; then scripts/container-base.sh >"$LOGS/container-base.log" 2>&1 & base=$!; fi
  bg_step "wheels and sdist built" scripts/build-wheels.sh || rc=$?
  if [ $rc = 0 ]; then echo ok >"$WHEELS_READY"; else echo "failed (exit $rc)" >"$WHEELS_READY"; return $rc; fi
  wait_for "$SETUP_DONE"  # its pytest is .venv's
  bg_step "wheels and sdist installed" env AIRHOST_TEST_DIST="$ROOT/dist" "$PY" -m pytest -q -p no:cacheprovider \
    --basetemp="/tmp/airhost-wheels-tests.$$" tests/py/test_wheels.py || return $?
  [ "$CONTAINERS" = 1 ] || return 0
  wait "$base" || { cat "$LOGS/container-base.log"; return 1; }
  bg_step "containers: image built and run" env AIRHOST_TEST_DIST="$ROOT/dist" "$PY" -m pytest -q -s \
    -p no:cacheprovider --basetemp="/tmp/airhost-container-tests.$$" tests/container
}
bg_sanitized() {
  # After the wheels (the pytest suite's GPU bundle test waits for them), and once .venv is
  # there: the sanitized trees' configure takes its Python and pybind11.
  [ "${AIRHOST_TEST_WHEELS:-1}" = 1 ] && wait_for "$WHEELS_READY"
  wait_for "$SETUP_DONE"
  if [ "${AIRHOST_TEST_FUZZ:-1}" = 1 ]; then bg_step "fuzz targets" env AIRHOST_FUZZ_TIMEOUT=300 scripts/fuzz.sh || return $?; fi
  if [ "${AIRHOST_TEST_SANITIZE:-1}" = 1 ]; then bg_step "sanitizer trees built" scripts/sanitize.sh build || return $?; fi
}
BACKGROUND=("fuzz, sanitizer trees")
background "fuzz, sanitizer trees" bg_sanitized
if [ "${AIRHOST_TEST_WHEELS:-1}" = 1 ]; then
  export AIRHOST_TEST_WHEELS_READY=$WHEELS_READY
  BACKGROUND+=("wheels")
  background "wheels" bg_wheels
fi

phase "set-up: .venv, airhost" env AIRHOST_SETUP_TEST_DEPS=1 scripts/setup.sh
# NVIDIA's headers, CUDA runtime and NCCL from their wheels (1.1 GB to download, once): the C++
# tests check airhost's own declarations of them against the headers, and run the doctor
# with the real libraries on this GPU-less machine.
phase "NVIDIA headers and libraries" "$PY" scripts/fetch-gpu-sdk.py build/gpu-sdk
echo ok >"$SETUP_DONE"
phase "build: doctest suite, helpers" build_dev

# The whole pytest suite but the wheels' file (tests/py/conftest.py: each test has its own
# ports, run directories and process checks, so it may run in several workers).
parallel=()
[ "$WORKERS" -gt 1 ] && parallel=(-n "$WORKERS" --dist loadfile)
phase "pytest suite ($WORKERS worker(s))" "$PY" -m pytest -q -p no:cacheprovider "${parallel[@]}" --durations=25 \
  --ignore=tests/py/test_wheels.py "$@"

# The doctest suite mostly waits (timeouts, sockets, processes): while the foreground waits for
# the background (its timing checks beside the background's low-priority builds, as they always
# ran, never beside the pytest workers' load).
background --beside "doctest suite" build/dev/airhost_tests --no-version=true --minimal=true
for part in "${BACKGROUND[@]}"; do phase "(waiting for the background: $part)" settle "$part"; done
phase "(waiting for the doctest suite)" settle "doctest suite"
# The doctest suite and a slice of the end-to-end suite under ASan and UBSan, the doctest suite
# under TSan, alone at the end (their deadlines are a sanitized binary's); a single report fails
# (tests/sanitizers/README.md: what is exempt, and why).
if [ "${AIRHOST_TEST_SANITIZE:-1}" = 1 ]; then phase "sanitizers: run" scripts/sanitize.sh run; fi
# Small versions of the benchmarks, each against its peer in the same run (bench/guard.py): a
# figure several times worse than its bound fails the run; its table stays in the log.
if [ "${AIRHOST_TEST_GUARD:-1}" = 1 ]; then phase "performance guard" "$PY" bench/guard.py --json-file "$LOGS/guard.json"; fi

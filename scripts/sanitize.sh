#!/usr/bin/env bash
# sanitize.sh — airhost's own code under the sanitizers; a single report fails it.
#  1. AddressSanitizer + UBSan, in build/fuzz (scripts/fuzz.sh's tree, configured in one place:
#     scripts/configure-sanitized.sh): the whole doctest suite, then a slice of the end-to-end
#     suite run with that build's airhost, airhost-rank and libairhost-rank-py.
#  2. ThreadSanitizer, in build/tsan: the doctest suite (the host's threads: the node link, the
#     console writer, the GPU usage reader, launches on several threads at once), its ranks
#     started from build/fuzz.
# The two doctest suites, which mostly wait, run beside the end-to-end slice.
# Every sanitizer writes its reports to build/sanitize-logs/ (log_path), never to a process's
# stderr: a report in a process whose exit status a test expects anyway (a host that must exit 1,
# a rank that must crash) fails the run all the same, and the ranks' logs stay what they printed.
# What is not checked, and why, is in tests/sanitizers/README.md. scripts/test.sh runs this
# (AIRHOST_TEST_SANITIZE=0 skips it); AIRHOST_SANITIZE_TSAN=0 skips step 2.
# Needs clang 16+ with its runtime (Debian 12: clang-16, libclang-rt-16-dev) and the .venv.
#
#   scripts/sanitize.sh          build both trees, then run
#   scripts/sanitize.sh build    build both trees only (scripts/test.sh does it in the background)
#   scripts/sanitize.sh run      build what is missing, then run
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
mode=${1:-all}
case "$mode" in all|build|run) ;; *) echo "sanitize.sh: build, run or nothing, not $mode" >&2; exit 2 ;; esac
tsan=${AIRHOST_SANITIZE_TSAN:-1}
PY=${AIRHOST_FUZZ_PYTHON:-$ROOT/.venv/bin/python}
LOGS=$ROOT/build/sanitize-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"

# Fails when any sanitizer wrote a report since the last check, printing each.
no_reports() {
  if [ -n "$(ls -A "$LOGS")" ]; then
    for f in "$LOGS"/*; do echo "=== $f" && head -n 120 "$f"; done >&2
    echo "sanitize.sh: $1: the sanitizer reports above (in $LOGS)" >&2
    exit 1
  fi
  echo "sanitize.sh: $1: no sanitizer report"
}
step() { echo "sanitize.sh: $1 ($(( SECONDS - started )) s)"; }
started=$SECONDS

# Options for every sanitized process, ranks included (they inherit the host's environment).
# The last word reads tests/sanitizers/<program>.asan_options where there is one: the ranks'
# (airhost-rank) turns leak detection off for their embedded Python alone, and leaves their
# crashes to the tests that cause them; the host and the test binary keep every check.
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:log_path=$LOGS/asan-ubsan:log_exe_name=1:include_if_exists=$ROOT/tests/sanitizers/%b.asan_options"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$LOGS/asan-ubsan:log_exe_name=1"
export TSAN_OPTIONS="second_deadlock_stack=1:suppressions=$ROOT/tests/sanitizers/tsan.supp:log_path=$LOGS/tsan:log_exe_name=1"

# --- the two trees ------------------------------------------------------------------------------
scripts/configure-sanitized.sh asan
cmake --build build/fuzz -j "$(nproc)" --target airhost_tests airhost_cli airhost_rank airhost_rank_py
step "ASan+UBSan: built"
if [ "$tsan" = 1 ]; then
  scripts/configure-sanitized.sh tsan
  # airhost_cli: test_doctor.cpp runs the airhost binary beside the tests. No rank here: a rank
  # is not run under TSan (AIRHOST_TEST_RANK_BINARY below, tests/sanitizers/README.md).
  cmake --build build/tsan -j "$(nproc)" --target airhost_tests airhost_cli
  step "TSan: built"
fi
[ "$mode" = build ] && exit 0

# --- 1. ASan + UBSan ---------------------------------------------------------------------------
# The two doctest suites mostly wait (timeouts, processes, sockets): they run beside the
# end-to-end slice, each printing into build/sanitize-out/ (not the reports' folder, where any
# file is a failure); the reports are read once all three are done.
OUT=$ROOT/build/sanitize-out
rm -rf "$OUT" && mkdir -p "$OUT"
declare -A PIDS
build/fuzz/airhost_tests --no-version=true --minimal=true >"$OUT/asan-doctest.log" 2>&1 &
PIDS["ASan+UBSan: doctest suite"]=$!
if [ "$tsan" = 1 ]; then
  # test_fault_guard.cpp is left out: read_guarded runs its read in a task cloned with CLONE_VM
  # and no thread of its own, which TSan's clone interceptor takes for a forked child (its
  # runtime fails a CHECK in the task). The host never calls it; ranks do, and they are ASan's.
  AIRHOST_TEST_RANK_BINARY=$ROOT/build/fuzz/airhost-rank \
    build/tsan/airhost_tests --no-version=true --minimal=true --source-file-exclude='*test_fault_guard.cpp' \
    >"$OUT/tsan-doctest.log" 2>&1 &
  PIDS["TSan: doctest suite"]=$!
fi

SLICE=(
  tests/py/test_cli_e2e.py
  tests/py/test_failures.py
  tests/py/test_host_outlives_clients.py::test_a_malformed_stacks_request_gets_one_error_and_the_run_goes_on
  tests/py/test_host_outlives_clients.py::test_the_warm_server_outlives_thousands_of_malformed_and_truncated_requests
  tests/py/test_host_outlives_clients.py::test_node_0_outlives_a_flood_of_junk_on_its_port_during_the_join
  tests/py/test_stacks.py::test_stacks_name_the_rank_in_its_data_loading_first_and_the_others_all_reduce
  tests/py/test_stacks.py::test_ctrl_backslash_prints_the_stacks_writes_them_down_and_the_run_goes_on
  tests/py/test_stacks.py::test_a_failure_says_where_the_other_ranks_were_before_they_are_stopped
  tests/py/test_stacks.py::test_bad_input_is_one_line_and_exit_2
  tests/py/test_stacks.py::test_warm_started_ranks_answer_too
  tests/py/test_stacks.py::test_sampling_names_the_straggler_and_what_the_others_wait_in
  tests/py/test_stacks.py::test_a_bad_sampling_length_is_one_line_and_exit_2
  tests/py/test_stacks.py::test_stacks_on_node_0_show_every_rank_of_every_node_the_odd_one_on_node_1_first
  tests/py/test_stacks.py::test_stacks_never_touch_the_ranks_own_fault_handlers
  tests/py/test_multinode.py::test_two_nodes_form_one_world_of_four_ranks
  tests/py/test_multinode.py::test_nodes_that_disagree_both_exit_2_naming_who_said_what
  tests/py/test_multinode.py::test_bad_multi_node_input_is_a_clear_error_and_starts_nothing
  tests/py/test_multinode.py::test_a_rank_failing_on_node_1_stops_node_0_naming_node_and_rank
  tests/py/test_multinode.py::test_a_frozen_node_0_is_lost_by_node_1_and_no_frame_arrives_corrupted
  tests/py/test_multinode.py::test_an_impostor_without_the_join_token_is_refused_and_the_real_node_still_joins
  tests/py/test_warm.py::test_a_warm_launch_forks_ranks_with_their_own_pid_group_env_and_logs
  tests/py/test_warm.py::test_a_failing_warm_rank_tears_the_group_down_and_leaves_no_process
  tests/py/test_warm.py::test_ctrl_c_stops_warm_ranks_and_leaves_no_process
  tests/py/test_warm.py::test_a_killed_warm_server_fails_its_ranks_clearly
)
failed=0
AIRHOST_TEST_AIRHOST=$ROOT/build/fuzz/airhost AIRHOST_TEST_BUILD_DIR=$ROOT/build/fuzz \
  "$PY" -m pytest -q -p no:cacheprovider "${SLICE[@]}" || failed=1
step "ASan+UBSan: end-to-end slice done"
for name in "${!PIDS[@]}"; do
  rc=0
  wait "${PIDS[$name]}" || rc=$?
  log=$OUT/$( [[ $name == TSan* ]] && echo tsan || echo asan )-doctest.log
  if [ $rc != 0 ]; then tail -n 60 "$log" >&2; echo "sanitize.sh: $name failed (exit $rc; $log)" >&2; failed=1
  else step "$name passed"; fi
done
no_reports "the doctest suites under ASan+UBSan and TSan, the end-to-end slice under ASan+UBSan"
[ $failed = 0 ] || { echo "sanitize.sh: a suite failed (above)" >&2; exit 1; }

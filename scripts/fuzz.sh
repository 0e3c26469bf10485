#!/usr/bin/env bash
# fuzz.sh [SECONDS] — builds libairhost with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer (build/fuzz), then runs each libFuzzer target
# of tests/fuzz/ from its committed corpus (tests/fuzz/corpus/NAME).
# A crash leaves its input in build/fuzz/crashes/: add it to the corpus and fix the parser, and
# it stays a regression test. Needs clang 16+ and its libclang-rt (Debian 12: clang-16, libclang-rt-16-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
# With SECONDS, each target searches that long; without, it runs a fixed number of inputs from
# a fixed seed (what scripts/test.sh does: the same inputs on every run, so CI fails only for
# a change of the code, never for a lucky draw).
SECONDS_EACH=${1:-}
# AIRHOST_FUZZ_TIMEOUT: seconds of wall clock one input may take before it counts as a hang (10).
# scripts/test.sh runs this at the lowest CPU priority behind the pytest suite, where an input
# of a millisecond may wait seconds for a core: it gives 300, which still catches a real hang.
# The ASan+UBSan tree, configured as scripts/sanitize.sh builds in it too (one configure for both).
scripts/configure-sanitized.sh asan
cmake --build build/fuzz -j "$(nproc)" --target fuzz_frames fuzz_records fuzz_stacks_request fuzz_link_messages
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1} UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p build/fuzz/crashes
for target in frames records stacks_request link_messages; do
  corpus=tests/fuzz/corpus/$target
  mkdir -p "$corpus" "build/fuzz/corpus-$target"
  # New inputs go to build/fuzz/corpus-NAME (the first folder), never into the committed corpus.
  if [ -n "$SECONDS_EACH" ]; then
    budget=(-max_total_time="$SECONDS_EACH")
  else
    budget=(-seed=1 -runs="${AIRHOST_FUZZ_RUNS:-100000}")
    rm -rf "build/fuzz/corpus-$target" && mkdir -p "build/fuzz/corpus-$target"
  fi
  work=("build/fuzz/corpus-$target")
  echo "fuzz.sh: fuzz_$target ${budget[*]} from $corpus ($(ls "$corpus" | wc -l) inputs)"
  build/fuzz/fuzz_$target "${budget[@]}" -timeout="${AIRHOST_FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix=build/fuzz/crashes/$target- "${work[@]}" "$corpus" 2>build/fuzz/$target.log \
    || { tail -n 60 build/fuzz/$target.log >&2; echo "fuzz.sh: fuzz_$target found a crash (build/fuzz/crashes/)" >&2; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build/fuzz/$target.log | sed "s/^/fuzz.sh: $target /"
done

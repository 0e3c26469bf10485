#!/usr/bin/env bash
# configure-sanitized.sh asan|tsan — configures one of the two sanitized build trees, with
# clang (Debian 12: clang-16, libclang-rt-16-dev); the one place that says how they are built.
#   asan: build/fuzz, AddressSanitizer + UBSan, the libFuzzer targets on (scripts/fuzz.sh
#         builds those, scripts/sanitize.sh the doctest suite, the CLI and the rank runtime
#         in the same tree: libairhost is compiled once for both).
#   tsan: build/tsan, ThreadSanitizer (scripts/sanitize.sh: the host's threads).
# AIRHOST_FUZZ_PYTHON: the Python whose headers the rank builds with.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: configure-sanitized.sh asan|tsan}
PY=${AIRHOST_FUZZ_PYTHON:-$(pwd)/.venv/bin/python}
# clang 16 or newer (C++20 lambdas that capture structured bindings): Debian 12's clang-16.
CXX=$(command -v clang++-16 || command -v clang++ || true)
CC=$(command -v clang-16 || command -v clang || true)
[ -n "$CXX" ] || { echo "configure-sanitized.sh: clang++ not found (apt-get install clang-16 libclang-rt-16-dev)" >&2; exit 2; }
case "$kind" in
  asan)
    dir=build/fuzz
    # -fno-sanitize=function: NVIDIA's C entry points are called through dlsym'd pointers of
    # airhost's own declarations (gpu/nvidia_api.hpp), whose opaque handle types are not the
    # library's: UBSan's function-type check would flag every call to the suite's fakes.
    SAN="-fsanitize=address,undefined -fno-sanitize=function -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    # -O1 and line tables, as the TSan tree: what ASan's and libFuzzer's docs advise, all a
    # report needs, and about a third less to compile than RelWithDebInfo's -O2 -g.
    extra=(-DAIRHOST_FUZZ=ON -DCMAKE_CXX_FLAGS="$SAN -fsanitize=fuzzer-no-link"
           -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG"
           -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG")
    ;;
  tsan)
    dir=build/tsan
    SAN="-fsanitize=thread -fno-omit-frame-pointer"
    # Built for this run alone: -O1 and line tables (all a report needs) compile faster.
    extra=(-DAIRHOST_FUZZ=OFF -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG"
           -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG")
    ;;
  *) echo "configure-sanitized.sh: asan or tsan, not $kind" >&2; exit 2 ;;
esac
# A unity build (CMakeLists.txt): these trees are built whole, once per run.
CC=$CC CXX=$CXX cmake -S . -B "$dir" -G Ninja -DAIRHOST_BUILD_PYTHON=OFF -DAIRHOST_UNITY_BUILD=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE="$PY" "${extra[@]}" -DCMAKE_C_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" >/dev/null

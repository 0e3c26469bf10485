#!/usr/bin/env bash
# build-wheels.sh — dist/: airhost's sdist, and from it one wheel per CPython (3.10-3.13),
# tagged manylinux_2_28_x86_64 like torch's own: they install with pip, no compiler, on glibc
# 2.28 or newer (RHEL/Rocky 8, Ubuntu 20.04, Debian 11 and later).
#
#   scripts/build-wheels.sh                 all four Pythons
#   AIRHOST_WHEEL_PYTHONS="3.11" scripts/build-wheels.sh
#
# How a wheel built on a newer system runs on glibc 2.28: the compiler is Zig's clang
# (`ziglang` from PyPI), which links against glibc 2.28's symbol versions whatever this
# machine's glibc is, and links LLVM's C++ runtime in statically (private to each binary:
# the extension and the rank's shared object export one symbol each). libuv and toml++ are
# built from third_party/ (scripts/vendor-deps.sh), static. No binary links libpython:
# airhost-rank loads the one of the environment it is installed into. `auditwheel show`
# then checks every wheel against the manylinux_2_28 policy.
#
# Each wheel compiles from the same unpacked sdist (build/wheel/src) through ccache, where it
# is installed (scripts/setup.sh installs it for the tests): all of airhost but the Python
# extension, libairhost-rank-py and one small source (host/base/built_for.cpp) is the same for
# every Python, so the first wheel compiles it and the other three take it from the cache.
#
# Needs: Debian/Ubuntu's apt-get the first time (the sources of libuv and toml++), PyPI (the
# build tools), and the CPythons: pyenv's, or python3.X on PATH. Prints each wheel's size.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHONS=${AIRHOST_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}
PLAT=manylinux_2_28_x86_64
GLIBC=2.28
TOOLS=$ROOT/build/wheel-tools
export PATH="$TOOLS/bin:$PATH"  # auditwheel runs patchelf
say() { echo "build-wheels: $*"; }
[ "$(uname -m)" = x86_64 ] || { echo "build-wheels: builds x86_64 wheels only; this machine is $(uname -m)" >&2; exit 2; }

# --- the build tools, in a venv of their own --------------------------------------------------
if [ ! -x "$TOOLS/bin/python" ]; then python3 -m venv "$TOOLS"; fi
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "ziglang==0.17.1" "build==1.*" "auditwheel==6.*" "patchelf"
ZIG=$("$TOOLS/bin/python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
mkdir -p "$TOOLS/zig"
for tool in cc c++; do
  # -fno-sanitize=all: zig's clang would otherwise add UBSan traps to code built without -O.
  printf '#!/bin/sh\nexec "%s" %s -target x86_64-linux-gnu.%s -fno-sanitize=all -g0 "$@"\n' "$ZIG" "$tool" "$GLIBC" >"$TOOLS/zig/$tool"
  chmod +x "$TOOLS/zig/$tool"
done
for tool in ar ranlib; do
  printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$ZIG" "$tool" >"$TOOLS/zig/$tool"
  chmod +x "$TOOLS/zig/$tool"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the sdist: the sources with libuv's and toml++'s inside ----------------------------------
[ -f third_party/libuv/CMakeLists.txt ] && [ -f third_party/tomlplusplus/include/toml++/toml.h ] || scripts/vendor-deps.sh
version=$(sed -nE 's/^version = "(.*)"/\1/p' pyproject.toml | head -n 1)
mkdir -p dist
rm -f "dist/airhost-$version.tar.gz"
for v in $PYTHONS; do rm -f dist/airhost-"$version"-cp"${v/./}"-*.whl; done  # the others' stay
say "making the sdist"
"$TOOLS/bin/python" -m build --sdist --outdir dist . >build/sdist.log 2>&1 || { cat build/sdist.log >&2; exit 1; }
sdist=dist/airhost-$version.tar.gz
tar -tzf "$sdist" >"$work/sdist.list"
grep -q "/third_party/libuv/src/unix/core.c$" "$work/sdist.list" || { echo "build-wheels: $sdist lacks third_party/libuv" >&2; exit 1; }

find_python() {  # find_python 3.11 → a CPython 3.11 with a shared libpython and headers
  local v=$1 p
  for p in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$v".*/bin/python"$v" "$(command -v "python$v" || true)"; do
    [ -x "$p" ] && { echo "$p"; return 0; }
  done
  return 1
}

# --- one wheel per Python, from the sdist, as pip would build it on a user's machine -----------
src=$ROOT/build/wheel/src
rm -rf "$src" && mkdir -p "$src"
tar -xzf "$sdist" -C "$src" --strip-components=1
cmake_args="-DCMAKE_AR=$TOOLS/zig/ar -DCMAKE_RANLIB=$TOOLS/zig/ranlib"
if command -v ccache >/dev/null; then
  # Paths under the repository are hashed relative to the build tree (each wheel's is
  # build/wheel/cpXY, as deep as the next), and the compiler by its wrapper's content.
  export CCACHE_DIR=$ROOT/build/wheel/ccache CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1 CCACHE_COMPILERCHECK=content
  ccache --zero-stats >/dev/null
  cmake_args+=" -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
else
  say "no ccache: each wheel compiles all of airhost (apt-get install ccache)"
fi
for v in $PYTHONS; do
  py=$(find_python "$v") || { echo "build-wheels: no CPython $v found (pyenv install $v, or put python$v on PATH)" >&2; exit 1; }
  say "building the wheel for Python $v ($py) with Zig's clang for glibc $GLIBC"
  start=$(date +%s)
  # The build tree is kept per Python under build/wheel/, so a rebuild compiles what changed.
  CC="$TOOLS/zig/cc" CXX="$TOOLS/zig/c++" CMAKE_ARGS="$cmake_args" \
    "$py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/$v" \
      --config-settings=build-dir="$ROOT/build/wheel/cp${v/./}" "$src" >"$work/$v.log" 2>&1 \
    || { tail -n 60 "$work/$v.log" >&2; echo "build-wheels: the wheel for Python $v failed to build" >&2; exit 1; }
  raw=$(ls "$work/$v"/airhost-*.whl)
  # repair: checks the policy and retags linux_x86_64 → manylinux_2_28 (it grafts nothing: no
  # binary needs a library outside the policy, which `show` below confirms).
  "$TOOLS/bin/auditwheel" repair --plat "$PLAT" --only-plat -w dist "$raw" >"$work/$v-repair.log" 2>&1 \
    || { cat "$work/$v-repair.log" >&2; exit 1; }
  wheel=$(ls dist/airhost-"$version"-cp"${v/./}"-*"$PLAT"*.whl)
  "$TOOLS/bin/auditwheel" show "$wheel" >"$work/$v-show.log" 2>&1 || { cat "$work/$v-show.log" >&2; exit 1; }
  grep -q "\"$PLAT\"" "$work/$v-show.log" || { cat "$work/$v-show.log" >&2; echo "build-wheels: $wheel is not $PLAT" >&2; exit 1; }
  say "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB, built in $(( $(date +%s) - start )) s; auditwheel: $PLAT"
done
say "sdist $(basename "$sdist"): $(du -k "$sdist" | cut -f1) KiB"
if command -v ccache >/dev/null; then say "ccache: $(ccache --print-stats | awk -F'\t' '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hit += $2 } $1 == "cache_miss" { miss = $2 } END { printf "%d objects compiled, %d taken from the cache", miss, hit }')"; fi

#!/usr/bin/env bash
# gpu-bundle.sh DIR — gathers into DIR what building and checking airhost needs on a GPU node
# with no package registry (an HPC site, a regulated cloud, the project's lent GPU machine),
# made here, where Debian's packages and PyPI are reachable. Then, on the node:
#
#     AIRHOST_GPU_BUNDLE=DIR scripts/gpu-check.sh
#
# builds airhost against the node's own python3 and torch, installing nothing from anywhere.
#
# DIR holds (about 10 MB; keep it out of git, e.g. under build/):
#   libuv/     (the fallback build, for a node whose Python has no wheel here)
#              libuv built here from Debian's source package (its security patches applied),
#              static and position-independent, so the CLI, the rank runtime and the Python
#              extension all link it and the node needs neither libuv nor pkg-config
#   include/   toml++'s headers, from Debian's libtomlplusplus-dev (header-only use)
#   wheels/    airhost's own wheels for the Pythons of AIRHOST_BUNDLE_PYTHONS (from dist/, made
#              by scripts/build-wheels.sh when missing), which the node installs with no build,
#              with cloudpickle and fsspec; and the wheels the checks need that a CUDA-torch node usually lacks:
#              DeepSpeed built here with no prebuilt ops (it compiles what it needs on the
#              node; the example uses none), and its needs beyond torch's (hjson, pydantic and
#              pydantic-core for each Python of AIRHOST_BUNDLE_PYTHONS, ...)
#   MANIFEST   what is in it, with versions and sizes
#
# Needs: apt-get (Debian/Ubuntu, no root needed), cmake, a C compiler, and a Python with pip
# (.venv's when scripts/setup.sh made one, so that DeepSpeed's wheel builds against its torch).
# AIRHOST_BUNDLE_PYTHONS: the node Pythons' versions to fetch binary wheels for (default
# "3.11 3.12"). AIRHOST_BUNDLE_DEEPSPEED=0 leaves DeepSpeed out.
set -euo pipefail
[ $# = 1 ] || { echo "usage: scripts/gpu-bundle.sh DIR (then AIRHOST_GPU_BUNDLE=DIR scripts/gpu-check.sh on the GPU node)" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
PYTHONS=${AIRHOST_BUNDLE_PYTHONS:-3.11 3.12}
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$OUT/libuv" "$OUT/include" "$OUT/wheels" "$OUT/MANIFEST"
mkdir -p "$OUT/include" "$OUT/wheels"
say() { echo "gpu-bundle: $*"; }

# --- libuv and toml++: Debian's sources (scripts/vendor-deps.sh), libuv built static and PIC ----
"$ROOT/scripts/vendor-deps.sh" "$work/src" >"$work/vendor.log" 2>&1 || { cat "$work/vendor.log" >&2; exit 1; }
uv_version=$(sed -nE 's/^libuv ([^,]*), .* with ([0-9]+) patch.*/\1/p' "$work/src/VERSIONS")
patches=$(sed -nE 's/^libuv [^,]*, .* with ([0-9]+) patch.*/\1/p' "$work/src/VERSIONS")
toml_version=$(sed -nE 's/^toml\+\+ ([^,]*), .*/\1/p' "$work/src/VERSIONS")
say "building libuv $uv_version ($patches Debian patch(es) applied), static and position-independent"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$work/src/libuv" -B "$work/libuv-build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DLIBUV_BUILD_SHARED=OFF -DLIBUV_BUILD_TESTS=OFF \
  -DLIBUV_BUILD_BENCH=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_INSTALL_PREFIX="$OUT/libuv" -DCMAKE_INSTALL_LIBDIR=lib >"$work/libuv-cmake.log" 2>&1 \
  || { cat "$work/libuv-cmake.log" >&2; exit 1; }
cmake --build "$work/libuv-build" -j "$(nproc)" >"$work/libuv-build.log" 2>&1 || { cat "$work/libuv-build.log" >&2; exit 1; }
cmake --install "$work/libuv-build" >/dev/null
# The static archive is all a build needs; libuv's CMake names it libuv.a (older ones libuv_a.a).
[ -f "$OUT/libuv/lib/libuv.a" ] || [ -f "$OUT/libuv/lib/libuv_a.a" ] || { echo "gpu-bundle: libuv built no static archive" >&2; exit 1; }
rm -rf "$OUT/libuv/lib/pkgconfig" "$OUT/libuv/lib/cmake" "$OUT/libuv/share"
cp -r "$work/src/tomlplusplus/include/toml++" "$OUT/include/"

# --- airhost's own wheels: what the node installs, with no build --------------------------
# One per Python of AIRHOST_BUNDLE_PYTHONS, from dist/ (scripts/build-wheels.sh makes what is
# missing), with airhost's two pure-Python needs. The build above stays as the fallback for a
# node whose Python has no wheel here.
if [ "${AIRHOST_BUNDLE_AIRHOST_WHEELS:-1}" = 1 ]; then
  version=$(sed -nE 's/^version = "(.*)"/\1/p' "$ROOT/pyproject.toml" | head -n 1)
  missing=()
  for v in $PYTHONS; do
    ls "$ROOT"/dist/airhost-"$version"-cp"${v/./}"-cp"${v/./}"-manylinux_*.whl >/dev/null 2>&1 || missing+=("$v")
  done
  if ((${#missing[@]})); then
    say "building airhost's wheels for Python ${missing[*]} (scripts/build-wheels.sh)"
    AIRHOST_WHEEL_PYTHONS="${missing[*]}" "$ROOT/scripts/build-wheels.sh" >"$work/wheels.log" 2>&1 || { tail -n 40 "$work/wheels.log" >&2; exit 1; }
  fi
  for v in $PYTHONS; do
    cp "$ROOT"/dist/airhost-"$version"-cp"${v/./}"-cp"${v/./}"-manylinux_*.whl "$OUT/wheels/"
  done
  "$PY" -m pip -q --disable-pip-version-check download --no-deps --only-binary=:all: -d "$OUT/wheels" \
    "cloudpickle>=2.0" "fsspec>=2023.1" >"$work/airhost-deps.log" 2>&1 || { cat "$work/airhost-deps.log" >&2; exit 1; }
fi

# --- wheels --------------------------------------------------------------------------------
pip_q=("$PY" -m pip -q --disable-pip-version-check)
if [ "${AIRHOST_BUNDLE_DEEPSPEED:-1}" = 1 ]; then
  # DeepSpeed is an sdist that imports torch to build; DS_BUILD_OPS=0 makes a wheel with no
  # compiled ops (any torch, any CUDA: it JIT-builds an op on first use, and the example uses none).
  say "building DeepSpeed's wheel (no prebuilt ops) with $("$PY" -c 'import sys; print(sys.executable)')"
  DS_BUILD_OPS=0 "${pip_q[@]}" wheel --no-deps --no-build-isolation -w "$OUT/wheels" "deepspeed==0.19.8" \
    >"$work/deepspeed.log" 2>&1 || { cat "$work/deepspeed.log" >&2; exit 1; }
  # Its needs that are neither torch's nor in a usual CUDA image; pydantic-core is compiled,
  # hence one wheel per Python version the node may have.
  pure=(hjson==3.1.0 pydantic==2.11.7 annotated-types==0.7.0 typing-inspection==0.4.1 typing-extensions==4.14.1)
  "${pip_q[@]}" download --no-deps --only-binary=:all: -d "$OUT/wheels" "${pure[@]}" >"$work/pure.log" 2>&1 \
    || { cat "$work/pure.log" >&2; exit 1; }
  for v in $PYTHONS; do
    "${pip_q[@]}" download --no-deps --only-binary=:all: --python-version "$v" --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$OUT/wheels" "pydantic-core==2.33.2" \
      >"$work/core-$v.log" 2>&1 || { cat "$work/core-$v.log" >&2; exit 1; }
  done
fi

{
  echo "airhost GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
  echo "libuv $uv_version (Debian source, $patches patch(es)), static PIC: $(cd "$OUT" && ls libuv/lib/*.a) $(du -sh "$OUT/libuv" | cut -f1)"
  echo "toml++ $toml_version headers: include/toml++ $(du -sh "$OUT/include" | cut -f1)"
  for w in "$OUT"/wheels/*.whl; do [ -f "$w" ] && echo "wheel: $(basename "$w") $(du -h "$w" | cut -f1)"; done
  echo "total: $(du -sh "$OUT" | cut -f1)"
} >"$OUT/MANIFEST"
sed 's/^/gpu-bundle: /' "$OUT/MANIFEST"
size_kb=$(du -sk "$OUT" | cut -f1)
if [ "$size_kb" -gt $((64 * 1024)) ]; then
  echo "gpu-bundle: $OUT is $((size_kb / 1024)) MiB, over the 64 MiB this bundle is meant to fit in" >&2
  exit 1
fi

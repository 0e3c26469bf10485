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
#   libuv/     libuv built here from Debian's source package (its security patches applied),
#              static and position-independent, so the CLI, the rank runtime and the Python
#              extension all link it and the node needs neither libuv nor pkg-config
#   include/   toml++'s headers, from Debian's libtomlplusplus-dev (header-only use)
#   wheels/    pure-Python wheels the checks need that a CUDA-torch node usually lacks:
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

# --- apt: a private list of this system's sources plus their deb-src twins -----------------
# No root and no change to the system's apt state: apt-get reads and writes only under $work.
mkdir -p "$work/apt/lists/partial" "$work/apt/parts" "$work/apt/cache/archives/partial"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  grep -E '^deb ' "$f" >>"$work/apt/parts/bundle.list" || true
  grep -E '^deb ' "$f" | sed 's/^deb /deb-src /' >>"$work/apt/parts/bundle.list" || true
done
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  sed -E 's/^Types:.*/Types: deb deb-src/' "$f" >"$work/apt/parts/$(basename "$f")"
done
APT=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/apt/parts"
     -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -o Debug::NoLocking=1
     -o APT::Sandbox::User=root)
say "reading the package lists (deb and deb-src) of this system's sources"
"${APT[@]}" update >"$work/apt-update.log" 2>&1 || { cat "$work/apt-update.log" >&2; exit 1; }

# --- libuv: Debian's source with its patches, built static and PIC --------------------------
(cd "$work" && "${APT[@]}" source --download-only libuv1 >"$work/apt-source.log" 2>&1) \
  || { cat "$work/apt-source.log" >&2; echo "gpu-bundle: could not fetch libuv1's source package" >&2; exit 1; }
orig=$(ls "$work"/libuv1_*.orig.tar.gz)
uv_version=$(basename "$orig" | sed -E 's/libuv1_(.*)\.orig\.tar\.gz/\1/')
mkdir -p "$work/libuv-src"
tar -xzf "$orig" -C "$work/libuv-src" --strip-components=1
debian_tar=$(ls "$work"/libuv1_*.debian.tar.* 2>/dev/null | head -n 1 || true)
patches=0
if [ -n "$debian_tar" ]; then
  tar -xf "$debian_tar" -C "$work/libuv-src"
  if [ -f "$work/libuv-src/debian/patches/series" ]; then
    while read -r p _; do
      case "$p" in ''|'#'*) continue ;; esac
      patch -s -p1 -d "$work/libuv-src" <"$work/libuv-src/debian/patches/$p"
      patches=$((patches + 1))
    done <"$work/libuv-src/debian/patches/series"
  fi
fi
say "building libuv $uv_version ($patches Debian patch(es) applied), static and position-independent"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$work/libuv-src" -B "$work/libuv-build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DLIBUV_BUILD_SHARED=OFF -DLIBUV_BUILD_TESTS=OFF \
  -DLIBUV_BUILD_BENCH=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_INSTALL_PREFIX="$OUT/libuv" -DCMAKE_INSTALL_LIBDIR=lib >"$work/libuv-cmake.log" 2>&1 \
  || { cat "$work/libuv-cmake.log" >&2; exit 1; }
cmake --build "$work/libuv-build" -j "$(nproc)" >"$work/libuv-build.log" 2>&1 || { cat "$work/libuv-build.log" >&2; exit 1; }
cmake --install "$work/libuv-build" >/dev/null
# The static archive is all a build needs; libuv's CMake names it libuv.a (older ones libuv_a.a).
[ -f "$OUT/libuv/lib/libuv.a" ] || [ -f "$OUT/libuv/lib/libuv_a.a" ] || { echo "gpu-bundle: libuv built no static archive" >&2; exit 1; }
rm -rf "$OUT/libuv/lib/pkgconfig" "$OUT/libuv/lib/cmake" "$OUT/libuv/share"

# --- toml++: Debian's headers --------------------------------------------------------------
(cd "$work" && "${APT[@]}" download libtomlplusplus-dev >"$work/apt-toml.log" 2>&1) \
  || { cat "$work/apt-toml.log" >&2; echo "gpu-bundle: could not fetch libtomlplusplus-dev" >&2; exit 1; }
deb=$(ls "$work"/libtomlplusplus-dev_*.deb)
toml_version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" "$work/toml"
cp -r "$work/toml/usr/include/toml++" "$OUT/include/"

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

#!/usr/bin/env bash
# vendor-deps.sh [DIR] — puts the sources of airhost's two C/C++ dependencies into DIR
# (default third_party/, which git ignores and the sdist carries), so that a build needs a C++
# compiler and nothing from the system's package manager:
#
#   DIR/libuv/         libuv from Debian's source package, Debian's patches applied (its
#                      security fixes), built by CMakeLists.txt as a static, PIC library
#   DIR/tomlplusplus/  toml++'s headers from Debian's libtomlplusplus-dev (header-only use),
#                      with its copyright file
#   DIR/VERSIONS       what is there
#
# Needs apt-get (Debian/Ubuntu; no root: it reads and writes apt state only under a temp dir).
# Safe to run again: it replaces DIR's two folders.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/third_party}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { echo "vendor-deps: $*"; }

# --- apt: a private list of this system's sources plus their deb-src twins -----------------
mkdir -p "$work/apt/lists/partial" "$work/apt/parts" "$work/apt/cache/archives/partial"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  grep -E '^deb ' "$f" >>"$work/apt/parts/vendor.list" || true
  grep -E '^deb ' "$f" | sed 's/^deb /deb-src /' >>"$work/apt/parts/vendor.list" || true
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

# --- libuv: Debian's source with its patches ------------------------------------------------
(cd "$work" && "${APT[@]}" source --download-only libuv1 >"$work/apt-source.log" 2>&1) \
  || { cat "$work/apt-source.log" >&2; echo "vendor-deps: could not fetch libuv1's source package" >&2; exit 1; }
orig=$(ls "$work"/libuv1_*.orig.tar.gz)
uv_version=$(basename "$orig" | sed -E 's/libuv1_(.*)\.orig\.tar\.gz/\1/')
rm -rf "$OUT/libuv"
mkdir -p "$OUT/libuv"
tar -xzf "$orig" -C "$OUT/libuv" --strip-components=1
debian_tar=$(ls "$work"/libuv1_*.debian.tar.* 2>/dev/null | head -n 1 || true)
patches=0
if [ -n "$debian_tar" ]; then
  mkdir -p "$work/uv-debian"
  tar -xf "$debian_tar" -C "$work/uv-debian"
  if [ -f "$work/uv-debian/debian/patches/series" ]; then
    while read -r p _; do
      case "$p" in ''|'#'*) continue ;; esac
      patch -s -p1 -d "$OUT/libuv" <"$work/uv-debian/debian/patches/$p"
      patches=$((patches + 1))
    done <"$work/uv-debian/debian/patches/series"
  fi
fi
# Only what a build reads travels: no tests, docs or other build systems (a smaller sdist).
rm -rf "$OUT/libuv/test" "$OUT/libuv/docs" "$OUT/libuv/img" "$OUT/libuv/m4" "$OUT/libuv/.github" \
  "$OUT/libuv/src/win" "$OUT/libuv/include/uv/win.h"
# libuv's CMakeLists lists its test sources only when tests are on (LIBUV_BUILD_TESTS=OFF).
say "libuv $uv_version ($patches Debian patch(es) applied) in $OUT/libuv"

# --- toml++: Debian's headers --------------------------------------------------------------
(cd "$work" && "${APT[@]}" download libtomlplusplus-dev >"$work/apt-toml.log" 2>&1) \
  || { cat "$work/apt-toml.log" >&2; echo "vendor-deps: could not fetch libtomlplusplus-dev" >&2; exit 1; }
deb=$(ls "$work"/libtomlplusplus-dev_*.deb)
toml_version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" "$work/toml"
rm -rf "$OUT/tomlplusplus"
mkdir -p "$OUT/tomlplusplus/include"
cp -r "$work/toml/usr/include/toml++" "$OUT/tomlplusplus/include/"
cp "$work/toml/usr/share/doc/libtomlplusplus-dev/copyright" "$OUT/tomlplusplus/LICENSE" 2>/dev/null || true
say "toml++ $toml_version headers in $OUT/tomlplusplus"

cat >"$OUT/VERSIONS" <<EOF
libuv $uv_version, Debian source package libuv1 with $patches patch(es) (MIT; libuv/LICENSE)
toml++ $toml_version, Debian package libtomlplusplus-dev, headers only (MIT; tomlplusplus/LICENSE)
EOF

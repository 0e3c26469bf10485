#!/usr/bin/env bash
# container-image.sh [TAG] — deploy/Dockerfile built with podman as tests/container/ and
# bench/container.py use it: on the bare Debian of scripts/container-base.sh, airhost from
# dist/'s wheel for CPython 3.11 (scripts/build-wheels.sh), torch's CPU wheel and airhost's
# dependencies from a folder that pip fills here first, installed in the image with no index
# (no network in the build, no image registry). TAG: localhost/airhost:test by default.
#
#   AIRHOST_DIST=DIR   where the wheels are (dist/ by default)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TAG=${1:-localhost/airhost:test}
DIST=${AIRHOST_DIST:-$ROOT/dist}
BASE=${AIRHOST_CONTAINER_BASE:-localhost/airhost-base:bookworm}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/container/containers.conf}
say() { echo "container-image: $*" >&2; }
version=$(sed -nE 's/^version = "(.*)"/\1/p' "$ROOT/pyproject.toml" | head -n 1)
wheel=$(ls "$DIST"/airhost-"$version"-cp311-*.whl 2>/dev/null | tail -n 1 || true)
[ -n "$wheel" ] || { say "no airhost $version wheel for CPython 3.11 in $DIST: scripts/build-wheels.sh makes it"; exit 2; }
"$ROOT/scripts/container-base.sh"
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/dist"
cp "$wheel" "$ctx/dist/"
py=$ROOT/.venv/bin/python
[ -x "$py" ] || py=python3
# The wheels for the image's CPython 3.11 (bookworm's), whatever this machine's Python is.
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 -d "$ctx/dist" "torch==2.13.0" numpy "cloudpickle>=2.0" "fsspec>=2023.1" 2>&1 \
  | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
start=$(date +%s)
podman build -q -f "$ROOT/deploy/Dockerfile" --build-arg BASE="$BASE" --build-arg PIP_INDEX=--no-index \
  --build-arg TORCH=torch==2.13.0 -t "$TAG" "$ctx" >/dev/null
size=$(podman image inspect "$TAG" --format '{{.Size}}')
say "$TAG built in $(( $(date +%s) - start )) s: $(( size / 1048576 )) MiB"

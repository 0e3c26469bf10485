#!/usr/bin/env bash
# container-base.sh — the base image tests/container/ builds deploy/Dockerfile on, with no image
# registry: a bare Debian bookworm (debootstrap --variant=minbase, from the machine's Debian
# mirror) with CPython 3.11 and its shared libpython, imported into podman as
# localhost/airhost-base:bookworm. Once per machine: ~80 s and ~200 MB the first time, kept
# in build/container/ and in podman's store.
#
#   scripts/container-base.sh          (root; podman and debootstrap: scripts/setup.sh with
#                                       AIRHOST_SETUP_TEST_DEPS=1 installs them)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${AIRHOST_CONTAINER_BASE:-localhost/airhost-base:bookworm}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/container/containers.conf}
say() { echo "container-base: $*" >&2; }
if podman image exists "$IMAGE"; then say "$IMAGE is there"; exit 0; fi
for tool in podman debootstrap; do
  command -v $tool >/dev/null || { say "no $tool: apt-get install podman debootstrap runc (or AIRHOST_SETUP_TEST_DEPS=1 scripts/setup.sh)"; exit 2; }
done
[ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 2; }
# The mirror apt uses here (deb822 or one-line sources), else Debian's own.
mirror=${AIRHOST_DEBIAN_MIRROR:-$( (awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null;
                                     awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null) | head -n 1 || true)}
mirror=${mirror:-http://deb.debian.org/debian}
tarball=$ROOT/build/container/base-bookworm.tar
mkdir -p "$(dirname "$tarball")"
if [ ! -f "$tarball" ]; then
  start=$(date +%s)
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  say "debootstrap bookworm from $mirror"
  debootstrap --variant=minbase --include=python3,python3-venv,libpython3.11 bookworm "$rootfs" "$mirror" \
    >"$ROOT/build/container/debootstrap.log" 2>&1 || { tail -n 30 "$ROOT/build/container/debootstrap.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  say "made $(du -m "$tarball" | cut -f1) MB in $(( $(date +%s) - start )) s"
fi
podman import -q --change 'CMD ["/bin/bash"]' "$tarball" "$IMAGE" >/dev/null
say "$IMAGE imported"

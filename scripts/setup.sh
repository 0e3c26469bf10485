#!/usr/bin/env bash
# Installs everything airhost needs on a fresh Debian/Ubuntu machine, builds it, and installs
# it into ./.venv (the `airhost` command lands in .venv/bin). Safe to run again: it only
# rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
build_pkgs=(g++ cmake pkg-config libuv1-dev libtomlplusplus-dev doctest-dev pybind11-dev python3-venv patch)
# The tests start a real Slurm (tests/py/test_slurm.py): its daemons and munge; iproute2
# for the network namespaces of its two nodes and of the multi-node tests (test_netns.py);
# patch and binutils (readelf) for the offline GPU bundle rehearsal (test_gpu_offline.py).
# clang-16 with its runtime: libFuzzer and the sanitizers of scripts/fuzz.sh. ccache: the four
# wheels of scripts/build-wheels.sh share all that does not depend on the Python. podman, runc
# and debootstrap: deploy/Dockerfile's image built and run as a container (tests/container/).
if [ "${AIRHOST_SETUP_TEST_DEPS:-0}" = 1 ]; then
  build_pkgs+=(slurm-wlm munge iproute2 patch binutils clang-16 libclang-rt-16-dev ccache podman runc debootstrap)
fi
for pkg in "${build_pkgs[@]}"; do
  # Installed, not merely known (a package removed but not purged keeps its config: dpkg -s passes).
  [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] || need_pkgs+=("$pkg")
done
# The tests run airhost as PID 1 of a pid namespace with util-linux's unshare (a container's
# entrypoint without a container engine); util-linux is essential on Debian, but not on every
# slim image.
if [ "${AIRHOST_SETUP_TEST_DEPS:-0}" = 1 ] && ! command -v unshare >/dev/null; then need_pkgs+=(util-linux); fi
# cmake and python3-venv may come from elsewhere (pip, pyenv): only ask apt when missing.
command -v cmake >/dev/null && need_pkgs=("${need_pkgs[@]/cmake}")
python3 -c "import venv, ensurepip" 2>/dev/null && need_pkgs=("${need_pkgs[@]/python3-venv}")
need_pkgs=($(printf '%s\n' "${need_pkgs[@]}" | grep -v '^$' || true))
if ((${#need_pkgs[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}"
fi

# libuv's and toml++'s sources (Debian's, their patches applied, and toml++'s fix of upstream
# issue 295) into third_party/: the build below and every later one use them, the sdist too.
[ -f third_party/tomlplusplus/include/toml++/toml.h ] && [ -f third_party/libuv/CMakeLists.txt ] || scripts/vendor-deps.sh
# AIRHOST_SETUP_ONLY=packages: this far (scripts/test.sh starts the wheels' build behind the rest).
[ "${AIRHOST_SETUP_ONLY:-}" = packages ] && exit 0

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch 2.13.0 CPU first, pinned: an unpinned "torch" would pull a multi-GB CUDA build.
"${PIP[@]}" "torch==2.13.0" numpy cloudpickle fsspec "scikit-build-core>=0.10" "pybind11>=2.10" ninja
if [ "${AIRHOST_SETUP_TEST_DEPS:-0}" = 1 ]; then
  "${PIP[@]}" pytest pytest-timeout pytest-xdist mlflow nbclient nbformat ipykernel lightning accelerate "ray[default]"
  # DeepSpeed is an sdist that imports torch to build: against the torch above, not a
  # build-isolation download of another one.
  "${PIP[@]}" --no-build-isolation "deepspeed==0.19.8"
fi
# No build isolation: the build directory (build/<wheel tag>) is then reused between runs.
"${PIP[@]}" --no-build-isolation .
echo "airhost installed: $(.venv/bin/airhost --version) ($(pwd)/.venv/bin/airhost)"

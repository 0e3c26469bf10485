#!/usr/bin/env bash
# Runs every test: the doctest suite (C++) and the pytest suite (end to end, real torch/gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
AIRHOST_SETUP_TEST_DEPS=1 scripts/setup.sh

# The C++ tests and the test helpers (the fake NVML) build in their own tree.
cmake -S . -B build/dev -G Ninja -DAIRHOST_BUILD_PYTHON=OFF -DPython3_EXECUTABLE="$(pwd)/.venv/bin/python" >/dev/null
cmake --build build/dev -j "$(nproc)"
(cd build/dev && ctest --output-on-failure)

export AIRHOST_TEST_BUILD_DIR="$(pwd)/build/dev"
.venv/bin/python -m pytest -q "$@"

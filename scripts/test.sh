#!/usr/bin/env bash
# Runs every test: the doctest suite (C++) and the pytest suite (end to end, real torch/gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
AIRHOST_SETUP_TEST_DEPS=1 scripts/setup.sh

# NVIDIA's headers, CUDA runtime and NCCL from their wheels (1.1 GB to download, once): the C++
# tests check airhost's own declarations of them against the headers, and run the doctor
# with the real libraries on this GPU-less machine.
.venv/bin/python scripts/fetch-gpu-sdk.py build/gpu-sdk

# The C++ tests and the test helpers (the fake NVML) build in their own tree.
cmake -S . -B build/dev -G Ninja -DAIRHOST_BUILD_PYTHON=OFF -DPython3_EXECUTABLE="$(pwd)/.venv/bin/python" \
  -DAIRHOST_GPU_SDK="$(pwd)/build/gpu-sdk" >/dev/null
cmake --build build/dev -j "$(nproc)"
(cd build/dev && ctest --output-on-failure)

# Every parser of outside bytes under libFuzzer, AddressSanitizer and UBSan, from its corpus
# (tests/fuzz/), a fixed number of runs from a fixed seed: the same inputs each time; a longer
# search is `scripts/fuzz.sh SECONDS`. AIRHOST_TEST_FUZZ=0 skips this.
if [ "${AIRHOST_TEST_FUZZ:-1}" = 1 ]; then scripts/fuzz.sh; fi

# The doctest suite and a slice of the end-to-end suite under AddressSanitizer and UBSan (in
# build/fuzz, beside the fuzz targets), the doctest suite under ThreadSanitizer (build/tsan); a
# single report fails (tests/sanitizers/README.md: what is exempt, and why).
# AIRHOST_TEST_SANITIZE=0 skips this.
if [ "${AIRHOST_TEST_SANITIZE:-1}" = 1 ]; then scripts/sanitize.sh; fi

# The sdist and a wheel per CPython 3.10-3.13, as users install them: tests/py/test_wheels.py
# installs each into a fresh venv with no compiler in reach (AIRHOST_TEST_WHEELS=0 skips this).
if [ "${AIRHOST_TEST_WHEELS:-1}" = 1 ]; then
  scripts/build-wheels.sh
  export AIRHOST_TEST_DIST="$(pwd)/dist"
fi

export AIRHOST_TEST_BUILD_DIR="$(pwd)/build/dev"
.venv/bin/python -m pytest -q "$@"

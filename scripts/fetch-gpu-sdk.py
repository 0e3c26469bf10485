#!/usr/bin/env python3
"""fetch-gpu-sdk.py — NVIDIA's headers and two of its libraries, for the tests, from PyPI.

airhost opens NVML, the CUDA runtime, NCCL and cuBLAS with dlopen and writes the few
declarations it calls out by hand (host/gpu/nvidia_api.hpp), so nothing of CUDA is needed to build
or run it. The tests check those declarations against NVIDIA's own headers, and drive
`airhost doctor` with NVIDIA's real CUDA runtime and NCCL on a machine without a GPU. This
script puts what they need in one folder, from NVIDIA's wheels on PyPI (pinned below):

    <dest>/include   cuda_runtime_api.h and the headers it includes (crt/ and nv/ among them),
                     nvml.h, nccl.h, cublas_api.h
    <dest>/lib       libcudart.so.13, libnccl.so.2 (x86_64 Linux; cuBLAS's libraries,
                     600 MB, are not kept: only its header is used)
    <dest>/VERSIONS  the wheels it came from; a folder with the same VERSIONS is kept as is

The wheels (1.1 GB, cuBLAS's and NCCL's most of it) are downloaded to <dest>/wheels and
deleted once unpacked; what stays takes about 350 MB.

Usage: fetch-gpu-sdk.py [DEST]   (default: build/gpu-sdk in the source tree)
"""
import os
import shutil
import subprocess
import sys
import zipfile

# name==version, and the members to keep: (prefix inside the wheel, where under DEST).
WHEELS = [
    ("nvidia-cuda-runtime==13.5.37", [("nvidia/cu13/include/", "include/"), ("nvidia/cu13/lib/libcudart.so.13", "lib/")]),
    ("nvidia-cuda-crt==13.5.37", [("nvidia/cu13/include/crt/", "include/crt/")]),
    ("nvidia-cuda-cccl==13.3.5.0.6", [("nvidia/cu13/include/nv/", "include/nv/")]),  # <nv/target>, for cuda_fp16.h
    ("nvidia-nvml-dev==13.5.37", [("nvidia/cu13/include/nvml.h", "include/")]),
    ("nvidia-nccl-cu13==2.32.3", [("nvidia/nccl/include/nccl.h", "include/"), ("nvidia/nccl/lib/libnccl.so.2", "lib/")]),
    ("nvidia-cublas==13.10.0.20", [("nvidia/cu13/include/cublas_api.h", "include/")]),
]


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dest = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "gpu-sdk"))
    stamp = "\n".join(name for name, _ in WHEELS) + "\n"
    stamp_path = os.path.join(dest, "VERSIONS")
    if os.path.exists(stamp_path) and open(stamp_path).read() == stamp:
        print(f"gpu-sdk: up to date in {dest}")
        return 0
    wheels = os.path.join(dest, "wheels")
    os.makedirs(wheels, exist_ok=True)
    # Linux x86_64 wheels whatever this machine is: the headers are the same everywhere, and
    # the tests that load the libraries run only on x86_64 Linux.
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
           "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
           "--platform", "manylinux_2_5_x86_64", "--platform", "manylinux1_x86_64",
           "-d", wheels] + [name for name, _ in WHEELS]
    if subprocess.call(cmd) != 0:
        print("gpu-sdk: pip download of NVIDIA's wheels failed (see above)", file=sys.stderr)
        return 1
    for sub in ("include", "lib"):
        shutil.rmtree(os.path.join(dest, sub), ignore_errors=True)
    for name, keep in WHEELS:
        project, version = name.split("==")
        prefix = project.replace("-", "_") + "-" + version + "-"
        found = [w for w in os.listdir(wheels) if w.startswith(prefix) and w.endswith(".whl")]
        if not found:
            print(f"gpu-sdk: no wheel for {name} in {wheels}", file=sys.stderr)
            return 1
        kept = 0
        with zipfile.ZipFile(os.path.join(wheels, found[0])) as z:
            for member in z.namelist():
                for src, dst in keep:
                    if member.endswith("/") or not member.startswith(src):
                        continue
                    rel = member[len(src):] if src.endswith("/") else os.path.basename(member)
                    out = os.path.join(dest, dst, rel)
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with z.open(member) as fin, open(out, "wb") as fout:
                        shutil.copyfileobj(fin, fout)
                    kept += 1
        if kept == 0:
            print(f"gpu-sdk: {found[0]} holds none of {[s for s, _ in keep]}", file=sys.stderr)
            return 1
    shutil.rmtree(wheels)  # 1.1 GB, of which the folder keeps what it needs
    with open(stamp_path, "w") as f:
        f.write(stamp)
    print(f"gpu-sdk: NVIDIA's headers and libraries in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

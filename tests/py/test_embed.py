"""A C++ program outside the tree links the installed airhost package and launches Python."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("AIRHOST_TEST_BUILD_DIR", os.path.join(ROOT, "build", "dev"))


@pytest.mark.timeout(600)
def test_an_outside_cmake_project_finds_links_and_runs_the_installed_airhost(tmp_path):
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        pytest.skip("needs the dev build (scripts/test.sh makes it)")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True, capture_output=True)
    for f in ("include/airhost/airhost.hpp", "lib/libairhost.a", "lib/cmake/airhost/airhostConfig.cmake", "bin/airhost-rank",
              "lib/airhost/libairhost-rank-py.so"):
        assert (prefix / f).exists(), f

    build = tmp_path / "embed"
    subprocess.run(
        ["cmake", "-S", os.path.join(ROOT, "examples", "embed_cpp"), "-B", str(build), "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}"],
        check=True, capture_output=True,
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)

    env = dict(os.environ, AIRHOST_RUNS_DIR=str(tmp_path / "runs"))
    # Ranks use the interpreter next to the program, or the one airhost was built with;
    # this test's venv has torch.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    p = subprocess.run(
        [str(build / "embed_demo"), os.path.join(ROOT, "examples", "embed_cpp", "train_fn.py"), "train", "2"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "embed_demo | rank 0 | rank 0 of 2: sum of ranks+1 = 3" in out
    assert "embed_demo | rank 1 | rank 1 of 2: sum of ranks+1 = 3" in out
    results = [json.loads(line.split(": ", 1)[1]) for line in out.splitlines() if "result of rank" in line]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["sum"] == 3.0 for r in results)
    assert "outcome: succeeded (exit 0)" in out


@pytest.mark.timeout(600)
def test_a_program_that_launches_again_and_again_leaks_nothing_and_does_not_grow(tmp_path):
    """150 launches from one C++ process, built with LeakSanitizer (GCC's -fsanitize=leak):
    nothing the library allocated is left unreachable at exit, and from launch 100 to 150 the
    process keeps its descriptors, threads and children and grows by less than 1 MB (the
    10,000-call figure for the Python API is bench/callers.py's)."""
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        pytest.skip("needs the dev build (scripts/test.sh makes it)")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True, capture_output=True)
    build = tmp_path / "embed-lsan"
    configured = subprocess.run(
        ["cmake", "-S", os.path.join(ROOT, "examples", "embed_cpp"), "-B", str(build), "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_CXX_FLAGS=-fsanitize=leak -g",
         "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=leak"], capture_output=True, text=True)
    assert configured.returncode == 0, configured.stderr
    built = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    if built.returncode != 0 and "lsan" in (built.stdout + built.stderr).lower():
        pytest.skip("this compiler has no LeakSanitizer runtime (liblsan)")
    assert built.returncode == 0, built.stdout + built.stderr
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(tmp_path / "runs"), LSAN_OPTIONS="exitcode=23")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    p = subprocess.run([str(build / "embed_demo"), os.path.join(ROOT, "bench", "scripts", "trivial_fn.py"), "train", "1",
                        "150"], env=env, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]  # 23: LeakSanitizer found a leak
    assert "LeakSanitizer" not in p.stderr
    points = {}
    for line in p.stdout.splitlines():
        if "after launch" in line:
            launch = int(line.split("after launch ")[1].split(":")[0])
            points[launch] = dict(kv.split("=") for kv in line.split(": ", 1)[1].split())
    first, last = points[100], points[150]
    assert (first["fds"], first["threads"], first["children"]) == (last["fds"], last["threads"], last["children"]), points
    assert int(last["rss_kb"]) - int(first["rss_kb"]) < 1024, points

"""`airhost.ray_init()` with the real Ray of the venv: it starts Ray sized by what airhost
detects (this node's CPUs, its GPUs through NVML: none here, two H100s with the fake NVML),
runs tasks and Ray Data, joins an instance that is already running instead of starting a
second one, and leaves no Ray process behind. Without Ray it is a clear ImportError.

Each caller runs in a child Python with its own short TMPDIR (Ray's Unix socket paths must
stay short) and this test's marker in its environment, which every Ray process inherits: so
the processes a test's Ray left running are exactly those carrying its marker. Ray start-up
takes about 10 s here, so the file starts Ray twice."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import HERE, live_processes, marker_of, wait_until_gone

sys.path.insert(0, str(HERE / "api_scripts"))
import _helpers  # noqa: E402

RAY_SCRIPTS = HERE / "ray_scripts"


def ray_script(name: str) -> str:
    path = RAY_SCRIPTS / name
    assert path.is_file(), path
    return str(path)


@pytest.fixture
def short_tmp():
    """A short TMPDIR for Ray (its socket paths hold it), removed with what Ray wrote there."""
    path = Path(tempfile.mkdtemp(prefix="ahray", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ray_env(tmp_path: Path, short_tmp: Path, **extra) -> dict:
    env = _helpers.base_env(tmp_path, extra=extra)
    for name in ("RAY_ADDRESS", "RAY_TMPDIR"):
        env.pop(name, None)
    env["TMPDIR"] = str(short_tmp)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def ray_processes(tmp_path: Path, name: str = "") -> list:
    return [p for p in live_processes(marker=marker_of(tmp_path)) if name in " ".join(p.cmdline)]


def assert_no_ray_left(tmp_path: Path) -> None:
    left = wait_until_gone(marker=marker_of(tmp_path), timeout=20.0)
    assert not left, "Ray processes outlived their driver:\n" + "\n".join(map(str, left))


@pytest.mark.timeout(60)
def test_without_ray_importable_ray_init_says_how_to_install_it_and_import_airhost_needs_no_ray(tmp_path):
    code = textwrap.dedent("""
        import importlib.abc, json, sys

        class NoRay(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "ray" or name.startswith("ray."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoRay())
        import airhost
        light = "ray" not in sys.modules and "torch" not in sys.modules
        try:
            airhost.ray_init()
            err = None
        except ImportError as e:
            err = {"type": type(e).__name__, "message": str(e), "cause": type(e.__cause__).__name__}
        print(json.dumps({"light": light, "error": err, "all": "ray_init" in airhost.__all__}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_helpers.base_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["light"], "import airhost imported ray or torch"
    assert out["all"]
    assert out["error"] == {"type": "ImportError", "message": "airhost.ray_init needs Ray: pip install 'ray[default]'",
                            "cause": "ModuleNotFoundError"}, out


@pytest.mark.timeout(120)
def test_ray_init_starts_ray_with_this_nodes_cpus_and_gpus_runs_tasks_and_data_and_stops_at_exit(tmp_path, short_tmp):
    work = tmp_path / "work"
    work.mkdir()
    caller = _helpers.run_caller(tmp_path, [ray_script("start_and_use.py")], env=ray_env(tmp_path, short_tmp),
                                 cwd=work, timeout=100)
    out = caller.ok().result
    res = out["resources"]
    assert res["CPU"] == out["usable_cpus"] == len(os.sched_getaffinity(0)), res  # no cgroup quota here
    assert out["detected_gpus"] == 0 and res.get("GPU", 0) == 0, res
    assert out["squares"] == [i * i for i in range(8)]
    assert out["rows"] == 100 and out["doubles_ok"] and out["ids"]
    # Its files went to the per-user directory of the caller's TMPDIR, none to the cwd.
    assert Path(out["session_dir"]).parent == short_tmp / f"ray-{os.getuid()}", out["session_dir"]
    assert list(work.iterdir()) == []
    # Called again: the same instance; a plain call is silent, one with settings says they are ignored.
    assert out["again_gcs_address"] == out["overridden_gcs_address"] == out["gcs_address"]
    assert out["quiet_warnings"] == [], out["quiet_warnings"]
    assert len(out["noisy_warnings"]) == 1, out["noisy_warnings"]
    note = out["noisy_warnings"][0]
    assert note.startswith("RuntimeWarning: Ray is already initialized") and "num_cpus, include_dashboard" in note
    # The script never called ray.shutdown(): the exit hook stopped what ray_init started.
    assert_no_ray_left(tmp_path)


@pytest.mark.timeout(120)
def test_ray_init_joins_a_running_instance_by_auto_or_ray_address_instead_of_starting_one(tmp_path, short_tmp):
    # The instance to join: started by ray_init in another process, on a node of two fake H100s.
    env = ray_env(tmp_path, short_tmp, AIRHOST_NVML_LIBRARY=_helpers.fake_nvml_library(),
                  AIRHOST_FAKE_NVML_GPUS=_helpers.TWO_FAKE_H100)
    release = tmp_path / "release"
    holder = _helpers.Background(tmp_path, [ray_script("hold.py"), release], env=env, name="holder")
    try:
        holder.wait_output([_helpers.RESULT_TAG], timeout=90)
        held = json.loads(holder.out.split(_helpers.RESULT_TAG, 1)[1].splitlines()[0])
        assert held["resources"]["GPU"] == 2, held  # the GPUs airhost detected, not Ray's own guess
        assert held["resources"]["CPU"] == len(os.sched_getaffinity(0)), held
        gcs_servers = ray_processes(tmp_path, "gcs_server")
        assert len(gcs_servers) == 1, gcs_servers

        joiner = _helpers.run_caller(tmp_path, [ray_script("join.py")], env=ray_env(tmp_path, short_tmp), timeout=80)
        out = joiner.ok().result
        for how in ("auto", "env"):
            seen = out[how]
            assert seen["gcs_address"] == held["gcs_address"], (how, seen)
            assert seen["resources"]["GPU"] == 2 and seen["resources"]["CPU"] == held["resources"]["CPU"], (how, seen)
            assert seen["square"] == 49
        assert out["refused"] and "num_cpus" in out["refused"], out["refused"]
        # Joining started nothing, and leaving did not stop the instance it joined.
        assert [p.pid for p in ray_processes(tmp_path, "gcs_server")] == [p.pid for p in gcs_servers]
        assert all(_helpers.process_state(p.pid) not in (None, "Z", "X") for p in gcs_servers)
    finally:
        release.touch()
        done = holder.finish(timeout=60)
    assert done.rc == 0 and "released" in done.out, holder.describe()
    assert_no_ray_left(tmp_path)

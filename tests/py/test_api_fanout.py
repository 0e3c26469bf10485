"""Python API: what travels to the ranks. The function, the classes and helpers it uses, its
captures and arguments go by value with cloudpickle; the caller's sys.path and interpreter
come along; each rank's return value comes back, in global rank order."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import run_dirs, run_scenario  # noqa: E402


@pytest.mark.timeout(120)
def test_a_main_function_using_a_module_level_class_and_helper_trains_with_ddp_on_two_gloo_ranks(api_tmp):
    caller = _helpers.run_caller(api_tmp, [_helpers.script("mlp_main.py")])
    if caller.rc != 0 and _helpers.torch_exit_abort(caller.err):  # upstream torch flake: once more
        caller = _helpers.run_caller(api_tmp, [_helpers.script("mlp_main.py")])
    caller.ok()
    out = caller.result
    results = out["results"]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["backend"] == "gloo" for r in results)
    assert all(r["model_class"] == "SimpleMLP" for r in results)
    # Ranks are processes of their own, not the caller.
    pids = {r["pid"] for r in results}
    assert len(pids) == 2 and out["caller_pid"] not in pids
    # DDP kept the replicas identical although each rank seeded its own weights and data.
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-9, abs=1e-9)
    assert all(isinstance(r["loss"], float) and r["loss"] == r["loss"] for r in results)
    assert out["local_name"] == "run_train"


@pytest.mark.timeout(60)
def test_a_closure_over_a_lock_is_a_type_error_naming_the_variable_before_anything_starts(api_tmp):
    caller = run_scenario(api_tmp, "fanout.py", "lock_closure").ok()
    for how in ("distributed", "submit"):
        err = caller.result[how]
        assert err is not None, f".{how}() accepted an unpicklable closure"
        assert err["type"] == "TypeError", err
        assert "'training_lock'" in err["message"], err
        assert "lock" in err["message"].lower()
    assert run_dirs(api_tmp) == [], "a run directory was created for a launch that could not start"
    assert _helpers.rank_processes(_helpers.runs_dir(api_tmp)) == []


@pytest.mark.timeout(60)
def test_a_module_level_lock_used_by_the_function_is_a_type_error_naming_the_global(api_tmp):
    err = run_scenario(api_tmp, "fanout.py", "lock_global").ok().result
    assert err is not None and err["type"] == "TypeError", err
    assert "'GLOBAL_LOCK'" in err["message"], err
    assert run_dirs(api_tmp) == []


def _mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.timeout(300)
def test_a_one_gib_captured_bytes_object_either_reaches_every_rank_or_fails_with_a_clear_message(api_tmp):
    if _mem_available_bytes() < 8 << 30:
        pytest.skip("needs 8 GB of available memory")
    import shutil

    if shutil.disk_usage(api_tmp).free < 4 << 30:
        pytest.skip("needs 4 GB of free disk for the payload")
    caller = run_scenario(api_tmp, "fanout.py", "big_bytes", timeout=240).ok()
    out = caller.result
    if "error" in out:  # allowed, if it says what to do
        assert out["error"]["type"] in ("ValueError", "MemoryError", "DistributedError"), out
        assert "large" in out["error"]["message"] or "memory" in out["error"]["message"].lower(), out
    else:
        assert out["results"] == [[1 << 30, [1, 1]], [1 << 30, [1, 1]]]
        # The caller is told that every rank loads its own copy.
        assert any(w.startswith("ResourceWarning") and "GiB" in w for w in out["warnings"]), out["warnings"]
    for d in run_dirs(api_tmp):  # 1 GiB per run directory: don't keep it past the test
        (d / "payload.pkl").unlink(missing_ok=True)


@pytest.mark.timeout(60)
def test_ranks_import_a_module_from_a_directory_the_caller_added_to_sys_path_at_run_time(api_tmp):
    out = run_scenario(api_tmp, "fanout.py", "sys_path", str(api_tmp)).ok().result
    assert [r["where"] for r in out["results"]] == ["0", "1"]
    for r in out["results"]:
        assert r["value"] == "from the caller sys.path"
        assert r["in_path"] is True
        assert r["file"].startswith(out["mod_dir"])


@pytest.mark.timeout(60)
def test_ranks_run_the_callers_interpreter_and_environment(api_tmp):
    out = run_scenario(api_tmp, "fanout.py", "executable").ok().result
    for r in out["results"]:
        assert r["executable"] == out["executable"] == _helpers.PYTHON
        assert r["prefix"] == out["prefix"]
        assert r["version"] == out["version"]


@pytest.mark.timeout(60)
def test_results_are_indexed_by_global_rank_whatever_order_the_ranks_finish_in(api_tmp):
    results = run_scenario(api_tmp, "fanout.py", "results_order").ok().result["results"]
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert [r["value"] for r in results] == [100, 101, 102]
    assert results[2]["finished"] < results[0]["finished"], "the ranks did not finish in reverse order"


@pytest.mark.timeout(60)
def test_instances_of_a_class_defined_in_main_come_back_as_that_class(api_tmp):
    out = run_scenario(api_tmp, "fanout.py", "main_class_result").ok().result
    assert out["types"] == ["Point", "Point"]
    assert out["isinstance"] == [True, True]
    assert out["norms"] == [1, 2]


@pytest.mark.timeout(60)
def test_a_function_returning_none_gives_a_list_of_none(api_tmp):
    assert run_scenario(api_tmp, "fanout.py", "none_result").ok().result == {"results": [None, None]}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["generator", "lock"])
def test_an_unpicklable_return_value_is_a_distributed_error_naming_the_rank(api_tmp, kind):
    err = run_scenario(api_tmp, "fanout.py", "unpicklable_result", kind).ok().result
    assert err is not None, "an unpicklable result did not fail"
    assert err["type"] == "DistributedError", err
    assert "RuntimeError" in err["mro"]
    assert err["failed_ranks"] == [1], err
    assert "rank 1" in err["message"]
    assert "cannot be" in err["message"] and "pickle" in err["message"], err["message"]
    assert ("generator" if kind == "generator" else "lock") in err["message"]

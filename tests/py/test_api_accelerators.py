"""Python API: accelerators. How many ranks a call gets and which GPUs, on this GPU-less node
and on a node of two H100s played by the FAKE NVML (tests/fake_nvml: a test stand-in for
libnvidia-ml, never NVIDIA's library); the AcceleratorType table."""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp, gpu_less_node  # noqa: E402,F401
from _helpers import TWO_FAKE_H100, base_env, run_caller, script  # noqa: E402

from airhost import AcceleratorType, GPUType  # noqa: E402


def call(tmp, options: dict, fake_gpus=None, extra_env=None) -> dict:
    env = base_env(tmp, fake_gpus=fake_gpus, extra=extra_env)
    return run_caller(tmp, [script("accel.py"), json.dumps(options)], env=env).ok().result


# ---- this node: no GPU ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_on_a_node_without_gpus_the_default_is_one_cpu_rank(api_tmp, gpu_less_node):
    got = call(api_tmp, {})
    assert [r["RANK"] for r in got["results"]] == ["0"]
    assert got["results"][0]["WORLD_SIZE"] == "1"
    assert got["results"][0]["CUDA_VISIBLE_DEVICES"] is None


@pytest.mark.timeout(60)
def test_on_a_node_without_gpus_num_accelerators_3_runs_three_cpu_ranks(api_tmp, gpu_less_node):
    got = call(api_tmp, {"num_accelerators": 3})
    assert [r["RANK"] for r in got["results"]] == ["0", "1", "2"]
    assert {r["WORLD_SIZE"] for r in got["results"]} == {"3"}
    assert {r["CUDA_VISIBLE_DEVICES"] for r in got["results"]} == {None}


@pytest.mark.timeout(60)
def test_on_a_node_without_gpus_a_gpu_accelerator_type_is_a_value_error_naming_what_was_asked_and_what_is_there(
        api_tmp, gpu_less_node):
    got = call(api_tmp, {"accelerator_type": "GPU_8xH100"})
    err = got["error"]
    assert err["type"] == "ValueError", got
    assert "GPU_8xH100" in err["message"] and "H100" in err["message"]
    assert "no GPU" in err["message"], err
    assert got["run_dirs"] == 0


# ---- the FAKE NVML: two H100s ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_with_fake_nvml_of_two_h100s_the_default_is_two_ranks_seeing_both_gpus(api_tmp):
    got = call(api_tmp, {}, fake_gpus=TWO_FAKE_H100)
    results = got["results"]
    assert [r["RANK"] for r in results] == ["0", "1"]
    assert [r["LOCAL_RANK"] for r in results] == ["0", "1"]
    assert {r["CUDA_VISIBLE_DEVICES"] for r in results} == {"0,1"}
    assert {r["CUDA_DEVICE_ORDER"] for r in results} == {"PCI_BUS_ID"}


@pytest.mark.timeout(60)
def test_with_fake_nvml_of_two_h100s_num_accelerators_3_is_a_value_error(api_tmp):
    got = call(api_tmp, {"num_accelerators": 3}, fake_gpus=TWO_FAKE_H100)
    err = got["error"]
    assert err["type"] == "ValueError", got
    assert "num_accelerators=3" in err["message"]
    assert "2 × NVIDIA H100 80GB HBM3" in err["message"], err
    assert got["run_dirs"] == 0


@pytest.mark.timeout(60)
def test_with_fake_nvml_of_two_h100s_accelerator_type_gpu_1xa10_is_a_mismatch_value_error(api_tmp):
    got = call(api_tmp, {"accelerator_type": "GPU_1xA10"}, fake_gpus=TWO_FAKE_H100)
    err = got["error"]
    assert err["type"] == "ValueError", got
    assert "GPU_1xA10" in err["message"] and "A10 GPUs" in err["message"]
    assert "NVIDIA H100 80GB HBM3" in err["message"], err


@pytest.mark.timeout(60)
def test_with_fake_nvml_of_two_h100s_accelerator_type_gpu_8xh100_is_accepted(api_tmp):
    got = call(api_tmp, {"accelerator_type": "GPU_8xH100"}, fake_gpus=TWO_FAKE_H100)
    assert "error" not in got, got
    assert [r["CUDA_VISIBLE_DEVICES"] for r in got["results"]] == ["0,1", "0,1"]


@pytest.mark.timeout(60)
def test_with_fake_nvml_legacy_gpu_type_h100_runs_like_accelerator_type_and_a10_mismatches(api_tmp):
    ok = call(api_tmp, {"gpus": 1, "gpu_type": "H100"}, fake_gpus=TWO_FAKE_H100)
    assert [r["CUDA_VISIBLE_DEVICES"] for r in ok["results"]] == ["0"], ok
    assert sum(w.startswith("FutureWarning") for w in ok["warnings"]) == 2, ok["warnings"]
    bad = call(api_tmp, {"gpu_type": "A10"}, fake_gpus=TWO_FAKE_H100)
    assert bad["error"]["type"] == "ValueError" and "A10" in bad["error"]["message"], bad


@pytest.mark.timeout(60)
def test_with_fake_nvml_and_cuda_visible_devices_1_in_the_caller_the_ranks_get_nvml_gpu_1_only(api_tmp):
    got = call(api_tmp, {}, fake_gpus=TWO_FAKE_H100, extra_env={"CUDA_VISIBLE_DEVICES": "1"})
    assert [r["CUDA_VISIBLE_DEVICES"] for r in got["results"]] == ["1"], got
    assert got["results"][0]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# ---- the accelerator types -------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_accelerator_type_has_the_databricks_names_and_every_entry_of_the_table():
    table = tomllib.loads((_helpers.REPO / "configs" / "accelerators.toml").read_text())["type"]
    names = [t["name"] for t in table]
    assert [m.value for m in AcceleratorType] == names
    for name in ("GPU_1xA10", "GPU_1xH100", "GPU_8xH100", "GPU_8xB300", "GPU_8xH200", "GPU_1xH200", "GPU_8xA100"):
        assert AcceleratorType[name].value == name
    for t in table:
        member = AcceleratorType[t["name"]]
        assert (member.gpu, member.count) == (t["gpu"], t["count"])
        assert str(member) == t["name"] and member == t["name"]  # a str enum: compares with its name
    assert AcceleratorType.GPU_8xH100.gpu == "H100" and AcceleratorType.GPU_8xH100.count == 8
    assert {g.value for g in GPUType} == {t["gpu"] for t in table}
    assert GPUType.H100.value == "H100"

"""Python API: the signature of @distributed. Bare and called forms, num_accelerators,
accelerator_type (a name or an AcceleratorType), timeout (3 h by default, None disables it),
the legacy gpus/gpu_type names (FutureWarning, same effect), and a ValueError naming every
bad value, raised when the function is decorated."""
from __future__ import annotations

import inspect
import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp, gpu_less_node  # noqa: E402,F401
from _helpers import base_env, run_caller, script  # noqa: E402

import airhost  # noqa: E402
from airhost import AcceleratorType, DistributedFunction, distributed  # noqa: E402


def add(a, b=1):
    """Adds."""
    return a + b


def launch(tmp, options: dict) -> dict:
    return run_caller(tmp, [script("accel.py"), json.dumps(options)], env=base_env(tmp)).ok().result


# ---- forms --------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_bare_decorator_wraps_the_function_with_default_options_and_keeps_it_callable_locally():
    fn = distributed(add)
    assert isinstance(fn, DistributedFunction)
    assert fn(2, b=3) == 5  # a plain local call
    assert fn.__name__ == "add" and fn.__doc__ == "Adds." and fn.__wrapped__ is add
    opts = fn.options
    assert opts.num_accelerators is None and opts.accelerator_type is None
    assert opts.timeout == 10800 and opts.tracking is True and opts.prefix is True


@pytest.mark.timeout(30)
def test_called_decorator_without_arguments_is_the_same_as_the_bare_one():
    fn = distributed()(add)
    assert isinstance(fn, DistributedFunction) and fn(1) == 2
    assert vars(fn.options) == vars(distributed(add).options)


@pytest.mark.timeout(30)
def test_the_default_timeout_is_three_hours():
    assert inspect.signature(distributed).parameters["timeout"].default == 10800
    assert airhost._api.DEFAULT_TIMEOUT == 10800


@pytest.mark.timeout(30)
def test_the_keywords_of_distributed_are_the_option_fields_in_order_with_their_defaults():
    # distributed() hands its keywords to _Options by name: one table, written once there.
    keywords = [(p.name, p.default) for p in inspect.signature(distributed).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY]
    fields = [(p.name, p.default) for p in inspect.signature(airhost._api._Options).parameters.values()]
    assert keywords == fields
    assert len(fields) == 13


@pytest.mark.timeout(30)
def test_num_accelerators_accelerator_type_and_timeout_are_kept():
    fn = distributed(num_accelerators=2, accelerator_type="GPU_8xH100", timeout=600)(add)
    assert fn.options.num_accelerators == 2
    assert fn.options.accelerator_type is AcceleratorType.GPU_8xH100
    assert fn.options.timeout == 600


@pytest.mark.timeout(30)
@pytest.mark.parametrize("spelling", [AcceleratorType.GPU_1xH100, "GPU_1xH100", "gpu_1xh100"])
def test_accelerator_type_may_be_the_enum_member_or_its_name_in_any_case(spelling):
    assert distributed(accelerator_type=spelling)(add).options.accelerator_type is AcceleratorType.GPU_1xH100


@pytest.mark.timeout(60)
def test_timeout_none_disables_the_timeout_and_the_run_completes(api_tmp):
    assert distributed(timeout=None)(add).options.timeout is None
    got = launch(api_tmp, {"num_accelerators": 2, "timeout": None})
    assert [r["RANK"] for r in got["results"]] == ["0", "1"], got


@pytest.mark.timeout(60)
def test_a_fractional_timeout_is_accepted(api_tmp):
    got = launch(api_tmp, {"num_accelerators": 1, "timeout": 2.5})
    assert [r["RANK"] for r in got["results"]] == ["0"], got


# ---- legacy names ---------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_legacy_gpus_gives_a_future_warning_and_sets_num_accelerators():
    with pytest.warns(FutureWarning, match="gpus=.*deprecated.*num_accelerators"):
        fn = distributed(gpus=4)(add)
    assert fn.options.num_accelerators == 4


@pytest.mark.timeout(30)
def test_legacy_gpu_type_gives_a_future_warning_and_asks_for_that_gpu_model():
    with pytest.warns(FutureWarning, match="gpu_type=.*deprecated.*accelerator_type"):
        legacy = distributed(gpu_type="H100")(add)
    with pytest.warns(FutureWarning):
        legacy_enum = distributed(gpu_type=airhost.GPUType.H100)(add)
    assert legacy.options.gpu_model == legacy_enum.options.gpu_model == "H100"
    assert legacy.options.gpu_model == distributed(accelerator_type="GPU_1xH100")(add).options.gpu_model


@pytest.mark.timeout(60)
def test_legacy_gpus_3_runs_three_ranks_like_num_accelerators_3(api_tmp, gpu_less_node):
    got = launch(api_tmp, {"gpus": 3})
    assert [r["RANK"] for r in got["results"]] == ["0", "1", "2"], got
    assert any(w.startswith("FutureWarning") for w in got["warnings"]), got


@pytest.mark.timeout(60)
def test_legacy_gpu_type_on_a_node_without_gpus_fails_like_accelerator_type(api_tmp, gpu_less_node):
    legacy = launch(api_tmp, {"gpu_type": "H100"})["error"]
    modern = launch(api_tmp, {"accelerator_type": "GPU_1xH100"})["error"]
    assert legacy["type"] == modern["type"] == "ValueError"
    assert "H100 GPUs" in legacy["message"] and "no GPU" in legacy["message"], legacy


@pytest.mark.timeout(30)
def test_the_legacy_future_warning_points_at_the_users_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distributed(gpus=2)  # THE-LEGACY-CALL
    assert len(caught) == 1
    assert caught[0].filename == __file__, caught[0].filename
    assert caught[0].lineno == _helpers.line_of(__file__, "THE-LEGACY-CALL")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("both", [dict(num_accelerators=2, gpus=2), dict(accelerator_type="GPU_1xH100", gpu_type="H100")],
                         ids=["num_accelerators-and-gpus", "accelerator_type-and-gpu_type"])
def test_giving_a_legacy_name_and_its_new_name_together_is_a_value_error(both):
    new, old = list(both)
    with pytest.warns(FutureWarning), pytest.raises(ValueError) as info:
        distributed(**both)
    assert new in str(info.value) and old in str(info.value)


# ---- bad values ------------------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, None.__class__])
def test_a_bad_num_accelerators_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError) as info:
        distributed(num_accelerators=value)
    assert "num_accelerators" in str(info.value) and repr(value) in str(info.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", [0, -5, "10", True])
def test_a_bad_timeout_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError) as info:
        distributed(timeout=value)
    assert "timeout" in str(info.value) and repr(value) in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_timeout_is_a_value_error_at_decoration_or_inf_runs_without_a_timeout(api_tmp, value):
    got = launch(api_tmp, {"num_accelerators": 1, "timeout": float(value)})
    if "error" in got:
        assert got["error"]["type"] == "ValueError" and "timeout" in got["error"]["message"], got
        assert got["run_dirs"] == 0, "a run directory was created for a call with a bad timeout"
    else:
        assert value == "inf", "timeout=nan was accepted"
        assert [r["RANK"] for r in got["results"]] == ["0"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["GPU_3xZ80", "H100", 8, ""])
def test_an_unknown_accelerator_type_is_a_value_error_naming_it_and_the_known_ones(value):
    with pytest.raises(ValueError) as info:
        distributed(accelerator_type=value)
    message = str(info.value)
    assert "accelerator_type" in message and repr(value) in message
    assert "GPU_8xH100" in message  # the known types are listed


@pytest.mark.timeout(30)
def test_an_unknown_legacy_gpu_type_is_a_value_error_naming_it():
    with pytest.warns(FutureWarning), pytest.raises(ValueError) as info:
        distributed(gpu_type="Z80")
    assert "gpu_type" in str(info.value) and "'Z80'" in str(info.value) and "H100" in str(info.value)


@pytest.mark.timeout(30)
def test_a_bad_legacy_gpus_is_a_value_error_naming_the_value():
    with pytest.warns(FutureWarning), pytest.raises(ValueError) as info:
        distributed(gpus=0)
    assert "got 0" in str(info.value)


@pytest.mark.timeout(30)
def test_a_non_callable_positional_argument_is_a_type_error():
    with pytest.raises(TypeError, match="@distributed"):
        distributed("train")

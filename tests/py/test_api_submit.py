"""Python API: `.submit()`, the non-blocking call. It returns a concurrent.futures.Future;
runs submitted together run together, and concurrent runs never share a GPU (GPU leases,
checked with the FAKE NVML of two H100s)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import TWO_FAKE_H100, base_env, run_scenario  # noqa: E402


@pytest.mark.timeout(90)
def test_two_submits_of_one_rank_each_return_futures_at_once_and_run_concurrently(api_tmp):
    out = run_scenario(api_tmp, "submit.py", "concurrent", api_tmp).ok().result
    assert out["is_future"] == [True, True]
    assert out["done_right_after_submit"] is False
    assert out["submit_seconds"] < 2.0, out
    assert out["pending"] == 0
    a, b = out["results"]
    assert [a[0]["tag"], b[0]["tag"]] == ["a", "b"]
    a, b = a[0], b[0]
    assert max(a["start"], b["start"]) < min(a["end"], b["end"]), f"the runs did not overlap: {a} {b}"
    assert a["pid"] != b["pid"]


@pytest.mark.timeout(60)
def test_a_failing_submitted_run_puts_the_distributed_error_in_its_future(api_tmp):
    err = run_scenario(api_tmp, "submit.py", "failure", api_tmp).ok().result
    assert err is not None and err["type"] == "DistributedError", err
    assert err["cause_type"] == "ValueError"
    assert "submitted and failed" in err["message"]


@pytest.mark.timeout(90)
def test_with_fake_nvml_concurrent_one_gpu_runs_get_different_gpus_and_a_third_waits_or_fails(api_tmp):
    env = base_env(api_tmp, fake_gpus=TWO_FAKE_H100)
    caller = run_scenario(api_tmp, "submit.py", "gpu_leases", api_tmp, env=env).ok()
    out = caller.result
    held = [r[0] for r in out["held"]]
    assert sorted(r["cvd"] for r in held) == ["0", "1"], held
    assert max(r["start"] for r in held) < min(r["end"] for r in held), "the 1-GPU runs did not overlap"
    # wait_for_accelerators=0 while both GPUs are held: a clear RuntimeError, at once.
    no_wait = out["no_wait"]
    assert no_wait is not None, "a third 1-GPU run started while both GPUs were held"
    assert no_wait["type"] == "RuntimeError" and no_wait["while_held"], no_wait
    assert "GPU" in no_wait["message"] and "wait_for_accelerators" in no_wait["message"], no_wait
    # wait_for_accelerators=None: it waited for a GPU, then ran on it.
    queued = out["queued"][0]
    assert queued["cvd"] in ("0", "1")
    assert queued["start"] >= min(r["end"] for r in held) - 0.05, (queued, held)
    assert "waiting for 1 free GPU" in caller.err, caller.describe()


@pytest.mark.timeout(90)
def test_with_fake_nvml_submit_returns_at_once_even_when_the_run_must_wait_for_a_gpu(api_tmp):
    env = base_env(api_tmp, fake_gpus=TWO_FAKE_H100)
    out = run_scenario(api_tmp, "submit.py", "queued_submit", api_tmp, env=env).ok().result
    queued = out["queued"][0]
    assert queued["cvd"] in ("0", "1")  # it did run, once a GPU was free
    assert out["submit_seconds"] < 1.0, f"submit() blocked {out['submit_seconds']:.1f} s waiting for a GPU"


@pytest.mark.timeout(90)
def test_with_fake_nvml_a_submitted_run_waiting_for_gpus_is_cancelled_at_once_and_never_starts(api_tmp):
    env = base_env(api_tmp, fake_gpus=TWO_FAKE_H100)
    out = run_scenario(api_tmp, "submit.py", "cancel_while_waiting", api_tmp, env=env).ok().result
    assert out["pending_while_waiting"] == [True, True], out
    assert out["cancel_returned"] is True
    assert out["c"] == "CancelledError" and out["d"] == "CancelledError", out
    assert out["cancel_seconds"] < 2.0, out
    assert out["held"] == ["a", "b"]
    assert out["started"] == ["a", "b"], "a cancelled run started once a GPU was free"


@pytest.mark.timeout(90)
def test_stop_on_a_running_future_tears_the_run_down_and_ends_it_with_cancelled_error(api_tmp):
    out = run_scenario(api_tmp, "submit.py", "stop_running", api_tmp).ok().result
    assert out["ended"] == "CancelledError", out
    assert "SIGTERM" in out["message"], out
    assert out["seconds"] < 20, out

"""The framework examples train on CPU ranks (gloo), launched both ways: by the CLI
(`airhost examples/X.py`) and through `@distributed` (a caller importing the example, or the
example's own `--via-api`). Each run must bring the loss down and leave every rank with the
same weights: the examples fingerprint the full weights (for FSDP and ZeRO-3 gathered from
the shards) on every rank.

Every run uses 2 ranks and 3 epochs (one FSDP run uses 3 ranks, for uneven shards): with the
same seed, data and Adam, DDP, FSDP2 and ZeRO-3 then do the same arithmetic, so their
per-epoch losses are compared with those of the DDP run, a check that sharding changed
nothing. Runtime on the 2-core machine: 90-120 s, mostly interpreter and import start-up
(deepspeed alone takes ~5 s to import).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401

EXAMPLES = REPO / "examples"
IMPORT_EXAMPLE = Path(__file__).resolve().parent / "framework_scripts" / "import_example.py"
EPOCHS = 3
THRESHOLD = 0.05  # what the examples' own exit status asks of the final loss

EPOCH_RE = re.compile(r"^(?:\[rank 0\] )?epoch (\d+)/(\d+)  loss (\d+\.\d+)$", re.M)
RANK_LINE_RE = re.compile(
    r"^rank (\d+) \((\w+), (\S+)\): final loss (\d+\.\d+), (\d+) weights \((\d+) updated by this rank\), "
    r"sha256 ([0-9a-f]{16})$", re.M)


def epoch_losses(text: str) -> list[float]:
    losses = []
    for m in EPOCH_RE.finditer(text):
        assert int(m.group(1)) == len(losses) + 1 and int(m.group(2)) == EPOCHS, text
        losses.append(float(m.group(3)))
    return losses


def assert_learns(losses: list[float]) -> None:
    assert len(losses) == EPOCHS, losses
    assert losses[-1] < losses[0] / 10 and losses[-1] < THRESHOLD, f"did not converge: {losses}"


def api_env(tmp: Path) -> dict:
    # base_env drops AIRHOST_*; no MLflow run per call (mlflow is installed here).
    return _helpers.base_env(tmp, extra={"AIRHOST_TRACKING": "0"})


def run_caller(tmp: Path, argv: list, timeout: float) -> _helpers.Caller:
    caller = _helpers.run_caller(tmp, argv, env=api_env(tmp), timeout=timeout)
    if caller.rc != 0 and _helpers.torch_exit_abort(caller.err + caller.out):  # upstream torch flake
        caller = _helpers.run_caller(tmp, argv, env=api_env(tmp), timeout=timeout)
    return caller.ok()


def run_cli(airhost, *args, timeout: float):
    run = airhost(*args, timeout=timeout)
    if run.rc != 0 and _helpers.torch_exit_abort(run.err + run.out):  # upstream torch flake: once more
        run = airhost(*args, timeout=timeout)
    return run


def rank_lines(out: str, ranks: int) -> list[dict]:
    """The per-rank summary lines that an example's --via-api prints."""
    found = [dict(rank=int(m.group(1)), backend=m.group(2), device=m.group(3), loss=float(m.group(4)),
                  numel=int(m.group(5)), local_numel=int(m.group(6)), sha256=m.group(7))
             for m in RANK_LINE_RE.finditer(out)]
    assert [r["rank"] for r in found] == list(range(ranks)), out
    return found


def assert_one_model(results: list[dict], ranks: int) -> None:
    """The ranks' own results: one world, gloo on CPU, and the same weights everywhere."""
    assert [r["rank"] for r in results] == list(range(ranks))
    assert all(r["backend"] == "gloo" and r["device"] == "cpu" for r in results), results
    assert len({r["sha256"] for r in results}) == 1, f"the ranks hold different weights: {results}"
    assert len({r["loss"] for r in results}) == 1, "the ranks report different losses"
    assert len({r["numel"] for r in results}) == 1


def assert_sharded(results: list[dict], ranks: int) -> None:
    """Each rank updated only its share of the weights, and the shares cover them all."""
    numel = results[0]["numel"]
    assert all(r["local_numel"] < numel for r in results), results
    assert sum(r["local_numel"] for r in results) >= numel, results
    # about 1/ranks each: FSDP2 splits every parameter by rows, so with rows that do not divide
    # evenly (a 1-row layer) the first ranks hold a little more
    assert max(r["local_numel"] for r in results) <= 1.1 * numel / ranks, results


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """DDP on 2 ranks through `@distributed`, the example imported by a caller script: the
    reference the sharded runs are compared with."""
    tmp = tmp_path_factory.mktemp("ddp")
    try:
        return run_caller(tmp, [IMPORT_EXAMPLE, "mlp_ddp", 2, EPOCHS], timeout=120)
    finally:
        left = _helpers.wait_no_ranks(_helpers.runs_dir(tmp), timeout=5.0)
        _helpers.kill_ranks(_helpers.runs_dir(tmp))
        assert not left, "rank processes outlived the DDP run:\n" + "\n".join(left)


# ---- DDP -------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_ddp_example_imported_by_a_caller_trains_through_distributed_and_the_replicas_agree(ddp):
    out = ddp.result
    assert out["module"] == "mlp_ddp" and out["module_file"] == str(EXAMPLES / "mlp_ddp.py")
    results = out["results"]
    assert_one_model(results, 2)
    assert all(r["all_sha256"] == [r["sha256"]] * 2 for r in results)
    assert all(r["local_numel"] == r["numel"] == 4929 for r in results)  # replicas: no sharding
    assert all(r["losses"] == results[0]["losses"] for r in results)
    assert_learns(results[0]["losses"])
    # rank 0's epoch lines reached the caller's stdout, prefixed, with the returned losses
    assert epoch_losses(ddp.out) == [round(v, 5) for v in results[0]["losses"]]


@pytest.mark.timeout(150)
def test_ddp_example_via_api_flag_runs_its_main_module_through_distributed(api_tmp, ddp):
    # Here train() and SimpleMLP live in the caller's __main__: they go to the ranks by value.
    caller = run_caller(api_tmp, [EXAMPLES / "mlp_ddp.py", "--via-api", "--accelerators", 2, "--epochs", EPOCHS],
                        timeout=140)
    results = rank_lines(caller.out, 2)
    assert_one_model(results, 2)
    assert "the ranks hold the same weights" in caller.out
    losses = epoch_losses(caller.out)
    assert_learns(losses)
    assert results[0]["loss"] == losses[-1]
    # the same run as the imported one: the same losses, the same weights
    assert losses == [round(v, 5) for v in ddp.result["results"][0]["losses"]]
    assert results[0]["sha256"] == ddp.result["results"][0]["sha256"][:16]


# ---- FSDP2 -----------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_fsdp_example_on_two_cli_ranks_learns_like_ddp_and_the_ranks_gather_the_same_weights(airhost, ddp):
    run = run_cli(airhost, EXAMPLES / "fsdp.py", "--accelerators", "2", "--", "--epochs", str(EPOCHS), timeout=120)
    run.assert_rc(0)
    assert [r["state"] for r in run.ranks] == ["succeeded"] * 2
    log0 = run.log(0).decode()
    losses = epoch_losses(log0)
    assert_learns(losses)
    assert re.search(rf"^final loss {losses[-1]:.5f}$", log0, re.M), log0
    assert re.search(r"^weights sha256 [0-9a-f]{16} on all 2 ranks$", log0, re.M), log0
    # Sharded or replicated, the same arithmetic: the losses of the DDP run.
    assert losses == pytest.approx(ddp.result["results"][0]["losses"], rel=1e-3, abs=1e-5)
    assert run.log(1) == b"" and run.log(1, "stderr") == b"", "rank 1 printed something"
    run.assert_console_matches_logs()


@pytest.mark.timeout(150)
def test_fsdp_example_via_api_on_three_ranks_shards_unevenly_and_every_rank_gets_the_same_weights(api_tmp):
    caller = run_caller(api_tmp, [EXAMPLES / "fsdp.py", "--via-api", "--accelerators", 3, "--epochs", EPOCHS],
                        timeout=140)
    results = rank_lines(caller.out, 3)
    assert_one_model(results, 3)
    assert_sharded(results, 3)
    assert sum(r["local_numel"] for r in results) == results[0]["numel"]  # FSDP2 shards carry no padding
    assert len({r["local_numel"] for r in results}) > 1  # 64 rows over 3 ranks: uneven shards
    assert "the ranks hold the same weights" in caller.out
    assert_learns(epoch_losses(caller.out))
    assert results[0]["loss"] == epoch_losses(caller.out)[-1]


# ---- DeepSpeed ZeRO --------------------------------------------------------------------------


@pytest.fixture
def deepspeed_installed():
    # A failure, not a skip: these tests are the only place DeepSpeed is checked off a GPU.
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail(f"deepspeed is not installed in {sys.prefix}: {sys.executable} -m pip install deepspeed==0.19.8")


@pytest.mark.timeout(150)
def test_deepspeed_zero3_example_on_two_cli_ranks_learns_like_ddp_and_the_ranks_gather_the_same_weights(
        deepspeed_installed, airhost, ddp):
    run = run_cli(airhost, EXAMPLES / "deepspeed_zero.py", "--accelerators", "2", "--", "--epochs", str(EPOCHS),
                  timeout=140)
    run.assert_rc(0)
    log0 = run.log(0).decode()
    losses = epoch_losses(log0)
    assert_learns(losses)
    assert re.search(rf"^final loss {losses[-1]:.5f} \(ZeRO stage 3\)$", log0, re.M), log0
    assert re.search(r"^weights sha256 [0-9a-f]{16} on all 2 ranks$", log0, re.M), log0
    assert losses == pytest.approx(ddp.result["results"][0]["losses"], rel=1e-3, abs=1e-5)
    # DeepSpeed ran on its CPU accelerator without compiling anything.
    assert "Setting accelerator to CPU" in run.out
    assert "built successfully" not in run.out + run.err
    assert "FutureWarning" not in run.err, run.err[-2000:]  # the example filters torch's deprecation noise
    run.assert_console_matches_logs()


@pytest.mark.timeout(150)
def test_deepspeed_zero2_example_via_api_partitions_the_optimizer_and_the_ranks_agree(deepspeed_installed, api_tmp):
    caller = run_caller(api_tmp, [EXAMPLES / "deepspeed_zero.py", "--via-api", "--accelerators", 2,
                                  "--epochs", EPOCHS, "--stage", 2], timeout=140)
    results = rank_lines(caller.out, 2)
    assert_one_model(results, 2)
    assert_sharded(results, 2)  # ZeRO-2: each rank updates its partition of the fp32 weights
    assert "the ranks hold the same weights" in caller.out
    losses = epoch_losses(caller.out)
    assert_learns(losses)
    assert results[0]["loss"] == losses[-1]


TORCH_OPS_CALLER = r'''
import json, torch
from airhost import distributed

@distributed(num_accelerators=2, tracking=False)
def add_one(x):
    # torch.ops in a function of __main__: cloudpickle alone fails on torch's _Ops object
    return torch.ops.aten.add(torch.tensor(x), 1).item()

print("RESULT " + json.dumps(add_one.distributed(41)))
'''


@pytest.mark.timeout(90)
def test_a_function_of_main_that_calls_torch_ops_travels_to_the_ranks(tmp_path):
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(tmp_path / "runs"), AIRHOST_TEST_MARK=str(tmp_path) + os.sep)
    p = subprocess.run([sys.executable, "-c", TORCH_OPS_CALLER], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=80)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RESULT [42, 42]" in p.stdout, p.stdout

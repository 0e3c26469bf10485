"""Fixtures of the Python API tests; test files import them by name (conftest.py is not ours)."""
from __future__ import annotations

import pytest

import _helpers


@pytest.fixture
def api_tmp(tmp_path):
    """The test's tmp directory (runs, locks, MLflow store); afterwards no rank of the test
    may still be running (zombies aside), and any that is gets SIGKILLed."""
    yield tmp_path
    left = _helpers.wait_no_ranks(_helpers.runs_dir(tmp_path), timeout=5.0)
    if left:
        _helpers.kill_ranks(_helpers.runs_dir(tmp_path))
    assert not left, "rank processes outlived the test:\n" + "\n".join(left)


@pytest.fixture(scope="session")
def gpu_less_node():
    """This node as it is, which must have no GPU (the tests describe a GPU-less node)."""
    if _helpers.node_has_gpus():
        pytest.skip("this node has GPUs; the test describes a node without any")

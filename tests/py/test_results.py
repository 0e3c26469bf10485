"""Results at memory speed: a rank's return value over 64 KiB comes back through shared
memory (a sealed memfd) or, when that lacks room, an unnamed file in the run directory, handed
over by descriptor; the caller's tensors and arrays lie in the mapped result, never copied.
Nothing is left behind (no file, no shared-memory object, no descriptor), and a rank that dies
while writing its result returns nothing."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import run_scenario  # noqa: E402

MIB = 1 << 20


@pytest.mark.timeout(300)
def test_four_ranks_return_256_mib_tensors_arrays_and_bytes_intact_without_a_copy_or_a_trace(api_tmp):
    out = run_scenario(api_tmp, "results.py", "big", timeout=280).ok().result
    assert [r["rank"] for r in out["ranks"]] == [0, 1, 2, 3]
    for rank, r in enumerate(out["ranks"]):
        assert r["tensor"] == ["torch.int32", [64 * MIB], True]
        assert r["tensor_ok"] and r["array_ok"] and r["bytes_ok"] and r["small"], r
        assert r["tensor_values"] == [1 * (rank + 1) + rank, (64 * MIB - 1) * (rank + 1) + rank]
        assert r["array"] == ["float64", [8 * MIB], True]
        assert r["view_shares"] and r["view_values"], "a view came back as a storage of its own"
        # Zero-copy: the caller's tensor and array are the shared memory the rank wrote.
        assert r["tensor_mapped_from"].startswith("/memfd:airhost-result"), r
        assert r["array_mapped_from"].startswith("/memfd:airhost-result"), r
    assert out["fds_while_held"] == [], "the caller holds descriptors of results"
    assert len(out["maps_while_held"]) >= 1
    assert out["maps_after"] == [], "results still mapped after the values went"
    assert out["fds_after"] == []
    assert out["shm_added"] == []
    assert out["left_in_run_dirs"] == []


@pytest.mark.timeout(180)
def test_a_result_over_the_shared_memory_limit_goes_through_an_unnamed_file_in_the_run_dir(api_tmp):
    env = _helpers.base_env(api_tmp)
    caller = _helpers.run_caller(api_tmp, [_helpers.script("results.py"), "fallback", str(MIB), "0"], env=env).ok()
    out = caller.result
    assert out["ok"] == [True, True]
    runs = _helpers.run_dirs(api_tmp)
    for where in out["mapped_from"]:  # an O_TMPFILE file: "<dir>/#<inode> (deleted)"
        assert where.startswith(str(runs[0] / "results") + "/") and where.endswith("(deleted)"), where
    assert caller.err.count("writing it to an unnamed file in") == 2, caller.err  # one note per rank
    assert "needs more than the 1.0 MiB of shared memory this rank may use" in caller.err
    assert out["fds_while_held"] == []
    assert out["maps_after"] == [] and out["left_in_run_dirs"] == []
    assert not (runs[0] / "results").exists()


@pytest.mark.timeout(180)
def test_a_result_that_outgrows_shared_memory_while_it_is_written_moves_to_the_run_dir(api_tmp):
    # 2 MiB of bytes in the pickle stream fit the 3 MiB limit; the tensor after them does not.
    out = run_scenario(api_tmp, "results.py", "fallback", str(3 * MIB), "2").ok().result
    assert out["ok"] == [True, True]
    assert all("/results/" in where for where in out["mapped_from"]), out
    assert out["maps_after"] == [] and out["left_in_run_dirs"] == []


@pytest.mark.timeout(180)
def test_a_result_neither_shared_memory_nor_the_disk_can_take_fails_the_run_clearly(api_tmp):
    out = run_scenario(api_tmp, "results.py", "disk_full").ok().result
    assert out["type"] == "DistributedError", out
    assert out["failed_ranks"] == [1]
    assert "ResultStorageError: rank 1 cannot store its result in" in out["message"], out["message"]
    assert "File too large" in out["message"] and "free space there" in out["message"]
    assert out["cause_type"] == "RuntimeError"  # the rank's exception, rebuilt here
    assert out["left_in_run_dirs"] == [] and out["fds"] == []


@pytest.mark.timeout(180)
def test_a_rank_killed_while_it_writes_its_result_fails_the_run_and_returns_nothing(api_tmp):
    out = run_scenario(api_tmp, "results.py", "killed_mid_result").ok().result
    assert out["type"] == "DistributedError", out
    assert out["failed_ranks"] == [1]
    assert "rank 1" in out["message"] and "SIGKILL" in out["message"]
    # Rank 0 either finished writing its 256 MiB first or was stopped by the teardown: both are
    # right, and which one depends on the machine's load.
    assert out["signals"][1] == 9 and out["signals"][0] in (0, 15), out["signals"]
    assert out["report_results"] == [False, False], "a result survived in the error's report"
    assert out["maps_after"] == [] and out["fds"] == [] and out["shm_added"] == []
    assert out["left_in_run_dirs"] == []


@pytest.mark.timeout(180)
def test_the_cli_saves_large_results_as_plain_pickles_that_load_without_airhost(airhost, work):
    (work / "arrays.py").write_text(
        "import os\n"
        "import numpy as np, torch\n"
        "def main():\n"
        "    rank = int(os.environ['RANK'])\n"
        "    return {'array': np.full(4 << 20, rank, dtype=np.int16), 'tensor': torch.full((1 << 20,), rank + 0.5),\n"
        "            'bytes': bytes([rank]) * (1 << 20)}\n"
    )
    run = airhost(str(work / "arrays.py") + ":main", "-n", "2", cwd=work)
    run.assert_rc(0)
    assert sorted(p.name for p in (run.run_dir / "results").iterdir()) == ["rank-0.pkl", "rank-1.pkl"]
    check = (
        "import pickle, sys\n"
        "for rank in (0, 1):\n"
        "    with open(sys.argv[1] + f'/rank-{rank}.pkl', 'rb') as f:\n"
        "        v = pickle.load(f)\n"
        "    assert (v['array'] == rank).all() and v['array'].shape == (4 << 20,), rank\n"
        "    assert (v['tensor'] == rank + 0.5).all() and v['tensor'].numel() == 1 << 20, rank\n"
        "    assert v['bytes'] == bytes([rank]) * (1 << 20)\n"
        "assert 'airhost' not in sys.modules\n"
        "print('loaded')\n"
    )
    proc = subprocess.run([sys.executable, "-c", check, str(run.run_dir / "results")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr
    assert all(r["has_result"] for r in run.ranks)


def test_a_small_result_still_travels_inline_and_loads_with_plain_pickle(airhost, work):
    (work / "small.py").write_text("import os\ndef main():\n    return {'rank': int(os.environ['RANK']), 'pad': b'x' * 1000}\n")
    run = airhost(str(work / "small.py") + ":main", "-n", "2", cwd=work)
    run.assert_rc(0)
    for rank in (0, 1):
        assert pickle.loads((run.run_dir / "results" / f"rank-{rank}.pkl").read_bytes()) == {"rank": rank, "pad": b"x" * 1000}

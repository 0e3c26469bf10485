"""airhost.data checkpoints: VolumeWriter / VolumeReader for torch.distributed.checkpoint and
latest_checkpoint, for real. Single-process saves run in this process (dcp with no_dist);
DDP and FSDP2 saves, async saves and the crash of a rank mid-save run on 2 gloo ranks started
by the airhost CLI (scripts in tests/py/ckpt_scripts), and the test then inspects the disk."""
from __future__ import annotations

import json
import os
import pickle
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict  # noqa: E402

from _helpers import torch_exit_abort  # noqa: E402  (tests/py/api_scripts, put on sys.path by conftest)
from airhost.data import VolumeReader, VolumeWriter, latest_checkpoint  # noqa: E402

CKPT_SCRIPTS = Path(__file__).resolve().parent / "ckpt_scripts"

# dcp.save/load with no_dist=True say so on every call; that is what these tests ask for.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


# ---- single process ----------------------------------------------------------------------


def mlp(seed: int, hidden: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def trained(seed: int, hidden: int = 8):
    model = mlp(seed, hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
    return model, optimizer


def state(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def save(model, optimizer, path, **kwargs) -> None:
    dcp.save(state(model, optimizer), storage_writer=VolumeWriter(path, **kwargs), no_dist=True)


def load_fresh(reader, hidden: int = 8):
    model = mlp(1234, hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sd = state(model, optimizer)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return model, optimizer


def assert_same(a, b) -> None:
    for (name, x), (_, y) in zip(a[0].state_dict().items(), b[0].state_dict().items()):
        assert torch.equal(x, y), name
    sa, sb = a[1].state_dict()["state"], b[1].state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[k][field], sb[k][field]), (k, field)


def files(path) -> list[str]:
    return sorted(os.listdir(path))


def test_a_single_process_round_trip_restores_model_and_optimizer_and_torch_reads_it_too(tmp_path):
    original = trained(0)
    ckpt = tmp_path / "step-000001"
    save(*original, ckpt)
    assert files(ckpt) == [".metadata", "__0_0.distcp"]  # published, nothing staged left behind
    assert_same(load_fresh(VolumeReader(ckpt)), original)
    assert_same(load_fresh(dcp.FileSystemReader(ckpt)), original)  # torch's own format
    assert latest_checkpoint(tmp_path) == str(ckpt)


def test_file_and_memory_urls_round_trip_through_fsspec(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    original = trained(0)
    # file:// is the local filesystem: same atomic renames, a plain path back from latest_checkpoint
    url = (tmp_path / "local").as_uri() + "/step-000007"
    save(*original, url)
    assert files(tmp_path / "local" / "step-000007") == [".metadata", "__0_0.distcp"]
    assert latest_checkpoint((tmp_path / "local").as_uri()) == str(tmp_path / "local" / "step-000007")
    assert_same(load_fresh(VolumeReader(url)), original)

    # memory:// goes through the remote path: written to the staging dir, uploaded, moved
    staging = tmp_path / "staging"
    staging.mkdir()
    root = f"memory://airhost-test-{os.getpid()}-{tmp_path.name}"
    try:
        save(*original, f"{root}/step-000003", staging_dir=staging)
        save(*original, f"{root}/step-000012", staging_dir=staging)
        memfs = fsspec.filesystem("memory")
        names = sorted(p.rsplit("/", 1)[-1] for p in memfs.ls(f"{root}/step-000012", detail=False))
        assert names == [".metadata", "__0_0.distcp"]
        assert os.listdir(staging) == []  # local staging files are gone once uploaded
        newest = latest_checkpoint(root)
        assert newest == f"{root}/step-000012"
        assert_same(load_fresh(VolumeReader(newest)), original)
        assert_same(load_fresh(VolumeReader(f"{root}/step-000003")), original)
    finally:
        fsspec.filesystem("memory").rm(root, recursive=True)


class ProbingWriter(VolumeWriter):
    """Records, when a rank starts writing shards, what the checkpoint directory holds."""

    seen: list[list[str]] = []

    def write_data(self, plan, planner):
        ProbingWriter.seen.append(files(self.path))
        return super().write_data(plan, planner)


def test_saving_over_a_checkpoint_unpublishes_it_before_any_shard_is_written(tmp_path):
    ckpt = tmp_path / "step-000005"
    save(*trained(0), ckpt)
    # leftovers of a save that died here: a staging file and torch's metadata temp file
    (ckpt / ".__0_0.distcp.0123456789ab.staging").write_bytes(b"torn")
    (ckpt / ".metadata.tmp").write_bytes(b"torn")
    newer = trained(1)
    ProbingWriter.seen = []
    dcp.save(state(*newer), storage_writer=ProbingWriter(ckpt), no_dist=True)
    # when shards were being written the old .metadata was already gone, so a crash then
    # would have left a directory that nothing mistakes for a checkpoint
    assert ProbingWriter.seen == [["__0_0.distcp"]]
    assert files(ckpt) == [".metadata", "__0_0.distcp"]
    assert_same(load_fresh(VolumeReader(ckpt)), newer)

    with pytest.raises(CheckpointException) as info:
        save(*trained(2), ckpt, overwrite=False)
    message = str(info.value)
    assert "FileExistsError" in message and str(ckpt) in message and "overwrite=False" in message
    assert_same(load_fresh(VolumeReader(ckpt)), newer)  # refused before touching anything


def test_latest_checkpoint_orders_by_step_number_else_by_completion_time(tmp_path):
    model, optimizer = trained(0)
    numbered = tmp_path / "numbered"
    for name in ("step-9", "step-000010", "step-2"):  # 10 > 9 although "step-9" > "step-000010"
        save(model, optimizer, numbered / name)
    assert latest_checkpoint(numbered) == str(numbered / "step-000010")
    assert latest_checkpoint(str(numbered)) == os.path.join(str(numbered), "step-000010")

    named = tmp_path / "named"
    for name, when in (("final", 2_000_000_000), ("best", 1_000_000_000), ("step-50", 1_500_000_000)):
        save(model, optimizer, named / name)
        os.utime(named / name / ".metadata", (when, when))
    # not every name has a number: the checkpoint completed last wins
    assert latest_checkpoint(named) == str(named / "final")

    assert latest_checkpoint(tmp_path / "does-not-exist") is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".hidden-scratch").mkdir()  # hidden: ignored without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert latest_checkpoint(tmp_path / "empty") is None
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        latest_checkpoint(tmp_path / "a-file")


def test_half_written_checkpoints_are_ignored_with_a_warning_naming_them(tmp_path):
    model, optimizer = trained(0)
    for step in range(1, 7):
        save(model, optimizer, tmp_path / f"step-{step:06d}")
    shard = "__0_0.distcp"
    (tmp_path / "step-000003" / shard).unlink()                                # a shard missing
    size = (tmp_path / "step-000004" / shard).stat().st_size
    os.truncate(tmp_path / "step-000004" / shard, size // 2)                   # a shard torn
    (tmp_path / "step-000005" / ".metadata").unlink()                          # never committed
    (tmp_path / "step-000006" / ".metadata").write_bytes(b"\x80\x04 not a pickle")  # garbage
    (tmp_path / "step-000007").mkdir()                                         # died at once
    (tmp_path / "step-000007" / f".{shard}.abcdef012345.staging").write_bytes(b"partial")

    with pytest.warns(UserWarning) as record:
        assert latest_checkpoint(tmp_path) == str(tmp_path / "step-000002")
    messages = [str(w.message) for w in record]
    expected = {
        "step-000003": f"{shard} (missing)",
        "step-000004": f"{shard} ({size // 2} bytes, .metadata needs {size})",
        "step-000005": "no .metadata file",
        "step-000006": ".metadata cannot be read",
        "step-000007": "no .metadata file",
    }
    for name, why in expected.items():
        hits = [m for m in messages if str(tmp_path / name) in m]
        assert len(hits) == 1 and why in hits[0], (name, messages)
    assert len(messages) == len(expected), messages

    with pytest.raises(FileNotFoundError, match=r"is incomplete and cannot be loaded: .*__0_0.distcp \(missing\)"):
        VolumeReader(tmp_path / "step-000003")
    with pytest.raises(FileNotFoundError, match=r"has no \.metadata file"):
        VolumeReader(tmp_path / "step-000005")


def test_loading_into_a_model_of_another_shape_names_the_parameter_and_both_shapes(tmp_path):
    """torch 2.13's own error already says it: "Size mismatch between saved torch.Size([8, 4])
    and current: torch.Size([16, 4]) for model.0.weight". A storage reader never sees the
    state dict before torch's planner raises this, so VolumeReader keeps it as it is. Mind that
    it arrives as a CheckpointException, which is a BaseException: `except Exception` misses it."""
    save(*trained(0, hidden=8), tmp_path / "step-000001")
    with pytest.raises(CheckpointException) as info:
        load_fresh(VolumeReader(tmp_path / "step-000001"), hidden=16)
    message = str(info.value)
    assert not isinstance(info.value, Exception)
    assert "ValueError: Size mismatch between saved torch.Size([8, 4]) and current: torch.Size([16, 4]) for model.0.weight" in message


def test_loading_from_a_path_without_a_checkpoint_says_what_to_pass_instead(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*missing: it does not exist.*latest_checkpoint\(root\)"):
        VolumeReader(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no \.metadata file .*pass the directory a VolumeWriter saved to"):
        VolumeReader(tmp_path / "empty")
    save(*trained(0), tmp_path / "root" / "step-000004")
    # the root of the checkpoints instead of one of them: the message names the one to use
    with pytest.raises(FileNotFoundError, match=r"holds checkpoints in its subdirectories.*step-000004"):
        VolumeReader(tmp_path / "root")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="it is a file"):
        VolumeReader(tmp_path / "file")
    # the same checks when the path comes through dcp.load(checkpoint_id=...)
    reader = VolumeReader(tmp_path / "root" / "step-000004")
    with pytest.raises(FileNotFoundError, match="it does not exist"):
        dcp.load(state(*trained(0)), storage_reader=reader, checkpoint_id=str(tmp_path / "gone"), no_dist=True)


def test_saving_where_the_parent_is_a_regular_file_fails_before_anything_starts(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError) as info:
        VolumeWriter(blocker / "ckpts" / "step-000001")
    assert str(blocker) in str(info.value) and "is a regular file, not a directory" in str(info.value)
    with pytest.raises(NotADirectoryError, match="it is a regular file"):
        VolumeWriter(blocker)
    writer = VolumeWriter(tmp_path / "fine")
    with pytest.raises(NotADirectoryError, match="is a regular file"):
        dcp.save(state(*trained(0)), storage_writer=writer, checkpoint_id=str(blocker / "x"), no_dist=True)
    assert not (tmp_path / "fine").exists()


def test_saving_without_collectives_is_refused(tmp_path):
    with pytest.raises(ValueError, match="use_collectives=True"):
        dcp.save(state(*trained(0)), storage_writer=VolumeWriter(tmp_path / "c"), no_dist=True,
                 use_collectives=False)
    assert not (tmp_path / "c" / ".metadata").exists()


# ---- two gloo ranks under airhost --------------------------------------------------------


def launch(airhost, script: str, *args, expect_ok: bool = True, timeout: float = 90):
    """airhost SCRIPT --accelerators 2 -- ARGS; a run that fails only with torch 2.13's
    exit-time abort of gloo ranks is retried once (see _helpers.torch_exit_abort)."""
    argv = [str(CKPT_SCRIPTS / script), "--accelerators", "2", "--", *map(str, args)]
    run = airhost(*argv, timeout=timeout)
    if expect_ok and run.rc != 0 and torch_exit_abort(run.err):
        run = airhost(*argv, timeout=timeout)
    return run


def results(run) -> dict[int, dict]:
    out = {}
    for n in (0, 1):
        for line in run.log(n).decode().splitlines():
            if line.startswith("RESULT "):
                out[n] = json.loads(line[len("RESULT "):])
    return out


def referenced_files(ckpt: Path) -> set[str]:
    with open(ckpt / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    return {info.relative_path for info in metadata.storage_data.values()}


def assert_published(ckpt: Path) -> None:
    names = files(ckpt)
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"], names
    assert referenced_files(ckpt) <= set(names)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("script", ["ddp.py", "fsdp.py"])
def test_two_ranks_save_and_async_save_then_load_back_exactly(airhost, tmp_path, script):
    """ddp.py: DDP on cpu:gloo. fsdp.py: FSDP2 fully_shard on a CPU mesh, the async save on a
    separate gloo group while training continues. Each rank checks that the loaded model and
    optimizer equal what was saved, through VolumeReader(latest_checkpoint(root)) and through
    torch's plain FileSystemReader."""
    root = tmp_path / "ckpts"
    run = launch(airhost, script, root)
    run.assert_rc(0)
    got = results(run)
    assert sorted(got) == [0, 1], run.describe()
    assert all(r["world"] == 2 and r["newest"] == str(root / "step-000002") for r in got.values())
    for n in (0, 1):
        log = run.log(n).decode()
        assert f"rank {n} VolumeReader(latest_checkpoint): equal" in log
        assert f"rank {n} FileSystemReader(step-000001): equal" in log
        assert "Traceback" not in run.log(n, "stderr").decode()
    for step in ("step-000001", "step-000002"):
        assert_published(root / step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert latest_checkpoint(root) == str(root / "step-000002")
    if script == "fsdp.py":
        # really sharded: each rank held half of the first layer and saved only that half
        assert got[0]["local_shapes"]["net.0.weight"] == [8, 8] == got[1]["local_shapes"]["net.0.weight"]
        with open(root / "step-000002" / ".metadata", "rb") as f:
            chunks = pickle.load(f).state_dict_metadata["model.net.0.weight"].chunks
        assert sorted(tuple(c.offsets) for c in chunks) == [(0, 0), (8, 0)]
    else:
        assert got[0]["backend"] == "cpu:gloo"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["mid-write", "after-shard"])
def test_a_rank_killed_mid_save_leaves_no_metadata_and_latest_checkpoint_falls_back(airhost, tmp_path, mode):
    root = tmp_path / "ckpts"
    run = launch(airhost, "crash.py", root, mode, expect_ok=False)
    run.assert_rc(137)
    assert run.rank(1)["signal_name"] == "SIGKILL", run.describe()
    assert f"rank 1 dying {mode}" in run.log(1).decode()
    assert "finished a save it should not have" not in run.out

    assert_published(root / "step-000001")
    crashed = root / "step-000002"
    names = files(crashed)
    assert ".metadata" not in names and ".metadata.tmp" not in names, names
    if mode == "mid-write":
        # rank 1's shard never got its name: only a partial staging file holds its bytes
        staged = [n for n in names if n.startswith(".__1_0.distcp.") and n.endswith(".staging")]
        assert len(staged) == 1 and (crashed / staged[0]).stat().st_size > 0, names
        assert "__1_0.distcp" not in names
    else:
        # every shard was in place, yet without the coordinator's .metadata it is no checkpoint
        assert "__0_0.distcp" in names and "__1_0.distcp" in names, names

    with pytest.warns(UserWarning, match=rf"ignoring {crashed}: no \.metadata file"):
        newest = latest_checkpoint(root)
    assert newest == str(root / "step-000001")
    with pytest.raises(FileNotFoundError, match=r"has no \.metadata file"):
        VolumeReader(crashed)

    # and the previous checkpoint resumes: load its model part into a plain module
    sys.path.insert(0, str(CKPT_SCRIPTS))
    try:
        from _common import MLP
    finally:
        sys.path.remove(str(CKPT_SCRIPTS))
    model = MLP()
    sd = {"model": get_model_state_dict(model)}
    before = {k: v.clone() for k, v in sd["model"].items()}
    dcp.load(sd, storage_reader=VolumeReader(newest), no_dist=True)
    assert any(not torch.equal(before[k], sd["model"][k]) for k in before)

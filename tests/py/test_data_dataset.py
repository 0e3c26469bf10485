"""airhost.data.VolumeDataset: listing, order, partition over ranks and DataLoader workers,
the node-local cache of remote files, resuming mid-epoch, and the errors of bad input.

Everything is real: files on disk, fsspec filesystems (memory://, file://, and subclasses of
fsspec's own local and memory filesystems registered under test protocols to count opens or
refuse reads), DataLoader worker processes, and ranks started by the installed airhost.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from torch.utils.data import DataLoader, DistributedSampler

from airhost.data import VolumeDataset

HERE = Path(__file__).resolve().parent
READ_RANKS = str(HERE / "data_scripts" / "read_ranks.py")
sys.path.insert(0, str(HERE / "api_scripts"))
from _helpers import torch_exit_abort  # noqa: E402


# ---- real fsspec filesystems for the tests --------------------------------------------------


class CountingMemoryFileSystem(MemoryFileSystem):
    """fsspec's in-memory filesystem under its own protocol and store, counting reads."""

    protocol = "countmem"
    store: dict = {}
    pseudo_dirs = [""]
    reads: list = []

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("countmem://"):
            path = path[len("countmem://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode:
            type(self).reads.append(path)
        return super()._open(path, mode, **kwargs)


class DenyingMemoryFileSystem(CountingMemoryFileSystem):
    """Lists its files, but refuses to open those whose name contains 'secret', as a store
    does with an object the credentials may list but not read."""

    protocol = "denymem"
    store: dict = {}
    pseudo_dirs = [""]

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("denymem://"):
            path = path[len("denymem://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode and "secret" in path:
            raise PermissionError(13, "Access Denied", path)
        return super()._open(path, mode, **kwargs)


fsspec.register_implementation("countmem", CountingMemoryFileSystem, clobber=True)
fsspec.register_implementation("denymem", DenyingMemoryFileSystem, clobber=True)


@pytest.fixture
def mem():
    """A fresh countmem:// store; returns (filesystem, the list of paths opened for reading)."""
    CountingMemoryFileSystem.store.clear()
    CountingMemoryFileSystem.pseudo_dirs[:] = [""]
    CountingMemoryFileSystem.reads = []
    fs = fsspec.filesystem("countmem")
    yield fs
    CountingMemoryFileSystem.store.clear()


@pytest.fixture(autouse=True)
def private_env(monkeypatch, tmp_path):
    """No launcher variables from outside; the default cache goes under tmp_path."""
    for name in ("RANK", "WORLD_SIZE", "AIRHOST_RUN_DIR", "TORCHELASTIC_RUN_ID", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRHOST_CACHE_DIR", str(tmp_path / "cache-root"))


def make_tree(root: Path, names, size: int = 0) -> Path:
    for name in names:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes((name.encode() * (size // max(1, len(name)) + 1))[:size] if size else name.encode())
    return root


def rel(paths, base) -> list:
    return [os.path.relpath(p, base).replace(os.sep, "/") for p in paths]


NAMES = [f"f{i:02d}.bin" for i in range(10)]


# ---- listing and filters ------------------------------------------------------------------------


def test_lists_recursively_sorted_in_place_and_skips_hidden_names(tmp_path):
    root = make_tree(tmp_path / "d", ["b.txt", "a/z.txt", "a/b/c.jpg", ".DS_Store", ".git/x.txt", "A.txt"])
    ds = VolumeDataset(root)
    assert ds.files == ["A.txt", "a/b/c.jpg", "a/z.txt", "b.txt"]
    assert list(ds) == [str(root / f) for f in ds.files]  # local paths, read in place
    assert ds.cache_dir is None and len(ds) == 4
    assert VolumeDataset(root, include_hidden=True).files == [".DS_Store", ".git/x.txt", "A.txt", "a/b/c.jpg",
                                                            "a/z.txt", "b.txt"]
    # one file is a dataset of one file; a relative path resolves from the working directory
    assert list(VolumeDataset(root / "b.txt")) == [str(root / "b.txt")]


def test_pattern_and_suffixes_select_files(tmp_path):
    root = make_tree(tmp_path / "d", ["x/1.JPG", "x/2.png", "y/3.jpg", "notes.txt"])
    assert VolumeDataset(root, pattern="*.jpg").files == ["y/3.jpg"]  # fnmatch: '*' crosses '/'
    assert VolumeDataset(root, pattern=["x/*", "*.txt"]).files == ["notes.txt", "x/1.JPG", "x/2.png"]
    assert VolumeDataset(root, suffixes=(".jpg", ".png")).files == ["x/1.JPG", "x/2.png", "y/3.jpg"]
    assert VolumeDataset(root, suffixes=".jpg", pattern="x/*").files == ["x/1.JPG"]


# ---- order and partition -------------------------------------------------------------------------


def test_order_is_deterministic_for_seed_and_epoch_and_is_distributed_samplers(tmp_path):
    root = make_tree(tmp_path / "d", NAMES)
    a = VolumeDataset(root, shuffle=True, seed=5)
    b = VolumeDataset(root, shuffle=True, seed=5)
    orders = []
    for epoch in range(3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        order = rel(a, root)
        assert order == rel(b, root) == rel(a, root)  # same seed and epoch: same order, every pass
        assert sorted(order) == NAMES
        sampler = DistributedSampler(range(10), num_replicas=1, rank=0, shuffle=True, seed=5)
        sampler.set_epoch(epoch)
        assert order == [NAMES[i] for i in sampler]  # the permutation DistributedSampler uses
        orders.append(order)
    assert len({tuple(o) for o in orders}) == 3, "the order did not change with the epoch"
    assert rel(VolumeDataset(root, shuffle=True, seed=6), root) != orders[0]
    assert rel(VolumeDataset(root), root) == NAMES


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_ranks_split_every_epoch_exactly_and_drop_last_or_pad_even_it_out(tmp_path, world):
    root = make_tree(tmp_path / "d", NAMES)
    for epoch in range(2):
        seen = {}
        for rank in range(world):
            ds = VolumeDataset(root, shuffle=True, seed=1, rank=rank, world_size=world)
            ds.set_epoch(epoch)
            seen[rank] = rel(ds, root)
            assert len(seen[rank]) == len(ds)
        flat = [f for r in seen.values() for f in r]
        assert sorted(flat) == NAMES  # each file once, no rank gets nothing twice
        assert max(map(len, seen.values())) - min(map(len, seen.values())) <= 1
        dropped = [rel(VolumeDataset(root, shuffle=True, seed=1, drop_last=True, rank=r, world_size=world), root)
                   for r in range(world)]
        assert {len(d) for d in dropped} == {10 // world}
        assert len(set(f for d in dropped for f in d)) == 10 // world * world
        padded = [rel(VolumeDataset(root, shuffle=True, seed=1, pad=True, rank=r, world_size=world), root)
                  for r in range(world)]
        assert {len(p) for p in padded} == {-(-10 // world)}
        assert set(f for p in padded for f in p) == set(NAMES)


def test_rank_and_world_size_come_from_the_environment_without_torch_distributed(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "d", NAMES)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert rel(VolumeDataset(root), root) == NAMES[1::3]
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match=r"RANK and WORLD_SIZE in the environment give rank=3 of world_size=3"):
        list(VolumeDataset(root))


def test_dataloader_workers_hand_a_rank_its_files_in_order_and_persistent_ones_follow_set_epoch(tmp_path):
    root = make_tree(tmp_path / "d", NAMES)
    ds = VolumeDataset(root, shuffle=True, seed=2, batch_size=3)
    alone = rel(ds, root)
    loader = DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True)
    batches = [rel(b, root) for b in loader]
    assert [len(b) for b in batches] == [3, 3, 3, 1]  # blocks of batch_size: one partial batch per rank
    assert [f for b in batches for f in b] == alone  # round-robin over workers = the rank's order
    ds.set_epoch(1)
    again = [f for b in loader for f in rel(b, root)]  # the same persistent workers
    assert again != alone and sorted(again) == NAMES
    fresh = VolumeDataset(root, shuffle=True, seed=2)
    fresh.set_epoch(1)
    assert again == rel(fresh, root)


# ---- the cache ----------------------------------------------------------------------------------------


def _cached_files(cache_dir) -> dict:
    files = Path(cache_dir) / "files"
    return {str(p.relative_to(files)): p.read_bytes() for p in files.rglob("*") if p.is_file()}


def test_memory_files_are_copied_once_and_reused_by_later_epochs_and_other_datasets(tmp_path, mem):
    for i, name in enumerate(NAMES[:6]):
        mem.pipe(f"/bucket/train/{'sub/' if i % 2 else ''}{name}", name.encode() * 100)
    cache = tmp_path / "c"
    ds = VolumeDataset("countmem://bucket/train", shuffle=True, cache_dir=cache)
    assert ds.cache_dir == str(cache)
    first = list(ds)
    assert len(mem.reads) == 6 and sorted(mem.reads) == sorted(f"/bucket/train/{f}" for f in ds.files)
    assert all(p.startswith(str(cache / "files") + os.sep) for p in first)
    contents = _cached_files(cache)
    assert contents == {f: Path(f).name.encode() * 100 for f in ds.files}  # relative layout kept
    inodes = {p: os.stat(p).st_ino for p in first}
    assert not os.listdir(cache / ".tmp")
    ds.set_epoch(1)
    second = list(ds)
    assert sorted(VolumeDataset("countmem://bucket/train", cache_dir=cache)) == sorted(first)
    assert len(mem.reads) == 6, "a cached file was copied again"
    assert sorted(second) == sorted(first) and second != first
    assert {p: os.stat(p).st_ino for p in second} == inodes
    # a file that changed at the source is copied again
    mem.pipe("/bucket/train/f00.bin", b"new content")
    ds = VolumeDataset("countmem://bucket/train", cache_dir=cache)
    assert Path(list(ds)[0]).read_bytes() == b"new content"
    assert mem.reads.count("/bucket/train/f00.bin") == 2 and len(mem.reads) == 7


def test_the_default_cache_dir_is_per_url_under_airhost_cache_dir(tmp_path, mem):
    mem.pipe("/b/one/x.bin", b"1")
    mem.pipe("/b/two/x.bin", b"2")
    one, two = VolumeDataset("countmem://b/one"), VolumeDataset("countmem://b/two")
    root = tmp_path / "cache-root" / "datasets"
    assert Path(one.cache_dir).parent == root and Path(two.cache_dir).parent == root
    assert one.cache_dir != two.cache_dir
    assert [Path(p).read_bytes() for p in (*one, *two)] == [b"1", b"2"]


def test_file_urls_are_read_in_place_unless_cache_is_true_then_copied_once(tmp_path):
    root = make_tree(tmp_path / "d", NAMES[:4], size=64)
    url = "file://" + str(root)
    assert list(VolumeDataset(url)) == [str(root / f) for f in NAMES[:4]]
    cache = tmp_path / "c"
    ds = VolumeDataset(url, cache=True, cache_dir=cache)
    first = list(ds)
    assert first == [str(cache / "files" / f) for f in NAMES[:4]]
    stamps = {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in first}
    assert all(abs(os.stat(p).st_mtime - os.stat(root / Path(p).name).st_mtime) < 1e-6 for p in first)  # source's
    ds.set_epoch(1)
    assert {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in ds} == stamps  # not copied again
    assert _cached_files(cache) == {f: (root / f).read_bytes() for f in NAMES[:4]}


def test_the_size_bound_evicts_least_recently_used_copies(tmp_path, mem):
    for name in NAMES[:6]:
        mem.pipe(f"/b/{name}", b"x" * 1000)
    cache = tmp_path / "c"
    ds = VolumeDataset("countmem://b", cache_dir=cache, cache_limit="2500B")
    seen = []
    for path in ds:
        seen.append(path)
        held = sum(len(v) for v in _cached_files(cache).values())
        assert held <= 2500 and os.path.exists(path)  # the file just yielded is there
    left = set(_cached_files(cache))
    assert NAMES[5] in left and NAMES[0] not in left  # the oldest went first
    assert len(mem.reads) == 6
    list(ds)  # evicted files are copied again
    assert len(mem.reads) > 6
    assert not os.listdir(cache / ".tmp")


def test_a_file_being_yielded_is_never_evicted(tmp_path, mem):
    for name in NAMES[:5]:
        mem.pipe(f"/b/{name}", b"x" * 1000)
    cache = tmp_path / "c"
    holder = iter(VolumeDataset("countmem://b", cache_dir=cache, cache_limit=2500))
    held = next(holder)  # f00 is pinned while this iterator has not moved on
    other = VolumeDataset("countmem://b", cache_dir=cache, cache_limit=2500, shuffle=True, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the bound holds: the pinned file and the one being copied fit
        for path in other:
            assert os.path.exists(held), f"{held} was evicted while being yielded"
            assert os.path.exists(path)
    assert len(_cached_files(cache)) == 2, "nothing was evicted: the test did not put the cache under pressure"
    assert Path(held).read_bytes() == b"x" * 1000
    assert os.path.exists(next(holder))  # moving on releases f00
    holder.close()


def test_copies_in_progress_and_leftovers_of_killed_copies(tmp_path, mem):
    """A temporary file still locked by its writer counts in the bound; one nobody holds and
    older than a minute is the left-over of a killed process and is removed."""
    for name in NAMES[:3]:
        mem.pipe(f"/b/{name}", b"x" * 1000)
    cache = tmp_path / "c"
    ds = VolumeDataset("countmem://b", cache_dir=cache, cache_limit=5000)
    stale = cache / ".tmp" / f"1000.1.{'a' * 32}"
    stale.write_bytes(b"partial")
    os.utime(stale, (1, 1))
    (cache / ".usage").write_text("999999")  # an estimate far too high forces a rescan
    assert len(list(ds)) == 3
    assert not stale.exists()
    assert int((cache / ".usage").read_text()) == 3000


# ---- resuming -------------------------------------------------------------------------------------------


def test_state_dict_resumes_mid_epoch_exactly_without_workers(tmp_path):
    root = make_tree(tmp_path / "d", NAMES)
    ds = VolumeDataset(root, shuffle=True, seed=9)
    ds.set_epoch(3)
    full = rel(ds, root)
    it = iter(ds)
    taken = [next(it) for _ in range(4)]
    state = ds.state_dict()
    assert state["epoch"] == 3 and state["position"] == 4
    state = json.loads(json.dumps(state))  # it goes into a checkpoint
    resumed = VolumeDataset(root, shuffle=True, seed=9)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    resumed.set_epoch(3)  # the loop sets the epoch it resumes: the position stays
    rest = rel(resumed, root)
    assert rel(taken, root) + rest == full
    assert rel(resumed, root) == full  # the next pass over the epoch starts from the top
    resumed.set_epoch(4)
    assert sorted(rel(resumed, root)) == NAMES


def test_state_dict_with_workers_needs_consumed_and_resumes_with_another_num_workers(tmp_path):
    root = make_tree(tmp_path / "d", NAMES)
    ds = VolumeDataset(root, shuffle=True, seed=1, batch_size=2)
    full = rel(ds, root)
    batches = iter(DataLoader(ds, batch_size=2, num_workers=2))
    taken = [f for _ in range(3) for f in rel(next(batches), root)]
    with pytest.raises(ValueError, match=r"read by DataLoader workers.*pass consumed="):
        ds.state_dict()
    state = ds.state_dict(consumed=6)
    del batches
    resumed = VolumeDataset(root, shuffle=True, seed=1, batch_size=2)
    resumed.load_state_dict(state)
    loader = DataLoader(resumed, batch_size=2, num_workers=1)
    rest = [f for b in loader for f in rel(b, root)]
    assert taken + rest == full
    # the position served one pass: the next one over the same epoch reads everything
    assert [f for b in loader for f in rel(b, root)] == full


def test_a_position_saved_at_one_world_size_resumes_at_another(tmp_path):
    root = make_tree(tmp_path / "d", NAMES)
    order = rel(VolumeDataset(root, shuffle=True, seed=4), root)
    taken, states = [], []
    for rank in range(2):  # two ranks took 2 files each
        ds = VolumeDataset(root, shuffle=True, seed=4, rank=rank, world_size=2)
        it = iter(ds)
        taken += rel([next(it), next(it)], root)
        states.append(ds.state_dict())
    assert states[0] == states[1] and states[0]["position"] == 4
    rest = []
    for rank in range(3):
        ds = VolumeDataset(root, shuffle=True, seed=4, rank=rank, world_size=3)
        ds.load_state_dict(states[0])
        rest += rel(ds, root)
    assert sorted(taken) == sorted(order[:4]) and sorted(rest) == sorted(order[4:])


def test_load_state_dict_refuses_other_files_or_order(tmp_path):
    root = make_tree(tmp_path / "d", NAMES)
    state = VolumeDataset(root, shuffle=True).state_dict()
    with pytest.raises(ValueError, match=r"saved with shuffle=True, seed=0, this dataset has shuffle=True, seed=1"):
        VolumeDataset(root, shuffle=True, seed=1).load_state_dict(state)
    (root / "new.bin").write_bytes(b"n")
    with pytest.raises(ValueError, match=r"saved over 10 files, and .* now holds 11"):
        VolumeDataset(root, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="not a state"):
        VolumeDataset(root).load_state_dict({"epoch": 1})


# ---- bad input ----------------------------------------------------------------------------------------------


def test_a_path_that_does_not_exist(tmp_path, mem):
    with pytest.raises(FileNotFoundError, match=r"VolumeDataset: .*nope does not exist; give the directory"):
        VolumeDataset(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"countmem://b/nope does not exist; check the URL"):
        VolumeDataset("countmem://b/nope")


def test_a_directory_without_files_or_without_matching_files(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / ".keep").write_text("")
    with pytest.raises(ValueError, match=r"empty holds no files \(1 hidden name.*include_hidden=True"):
        VolumeDataset(tmp_path / "empty")
    root = make_tree(tmp_path / "d", ["a.png", "b.txt"])
    with pytest.raises(ValueError, match=r"no file under .* matches pattern='\*.jpg' \(it holds 2 file\(s\), such as "
                                         r"'a.png', 'b.txt'\); fix the filter"):
        VolumeDataset(root, pattern="*.jpg")


def test_a_dangling_symlink_and_a_file_removed_after_listing(tmp_path):
    root = make_tree(tmp_path / "d", ["a.bin", "b.bin"])
    (root / "c.bin").symlink_to(tmp_path / "gone.bin")
    with pytest.raises(FileNotFoundError, match=r"c.bin is a symbolic link to .*gone.bin', which does not exist"):
        VolumeDataset(root)
    (root / "c.bin").unlink()
    ds = VolumeDataset(root)
    (root / "b.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"b.bin was listed when the dataset was built but cannot be read"):
        list(ds)


def test_a_remote_file_that_cannot_be_read(tmp_path):
    fs = fsspec.filesystem("denymem")
    fs.pipe("/b/ok.bin", b"1")
    fs.pipe("/b/secret.bin", b"2")
    ds = VolumeDataset("denymem://b", cache_dir=tmp_path / "c")
    with pytest.raises(PermissionError, match=r"cannot read /b/secret.bin: PermissionError: .*Access Denied.*"
                                              r"Check that this process may read it"):
        list(ds)
    assert not os.listdir(tmp_path / "c" / ".tmp")  # nothing half-copied is left
    assert list(VolumeDataset("denymem://b", cache_dir=tmp_path / "c", pattern="ok*"))


def test_a_cache_directory_that_cannot_be_written(tmp_path, mem):
    mem.pipe("/b/a.bin", b"1")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match=r"the cache directory .*a-file/cache cannot be used .*Pass cache_dir= a "
                                      r"writable local directory"):
        VolumeDataset("countmem://b", cache_dir=blocker / "cache")
    # a directory that caches another source's files (same relative names) is refused too
    mem.pipe("/other/a.bin", b"2")
    VolumeDataset("countmem://b", cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"holds copies of countmem:///b, not of countmem:///other; .*give each "
                                         r"source its own cache_dir"):
        VolumeDataset("countmem://other", cache_dir=tmp_path / "c")


def test_a_cache_bound_smaller_than_a_file(tmp_path, mem):
    mem.pipe("/b/small.bin", b"1" * 10)
    mem.pipe("/b/big.bin", b"1" * 5000)
    with pytest.raises(ValueError, match=r"cache_limit='4KB' \(4000 bytes\) is smaller than 'big.bin' "
                                         r"\(5000 bytes\), the largest file"):
        VolumeDataset("countmem://b", cache_dir=tmp_path / "c", cache_limit="4KB")


def test_urls_need_fsspec_and_a_known_protocol(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"fsspec knows no filesystem for nosuchfs://"):
        VolumeDataset("nosuchfs://x/y")
    monkeypatch.setitem(sys.modules, "fsspec", None)  # what `import fsspec` meets when it is not installed
    with pytest.raises(ImportError, match=r"reading URLs needs fsspec: pip install fsspec"):
        VolumeDataset("memory://x")
    assert VolumeDataset(make_tree(tmp_path / "d", ["a"])).files == ["a"]  # local paths do not need it


def test_contradicting_or_meaningless_arguments(tmp_path, mem):
    root = make_tree(tmp_path / "d", ["a"])
    mem.pipe("/b/a", b"1")
    with pytest.raises(ValueError, match="drop_last=True and pad=True"):
        VolumeDataset(root, drop_last=True, pad=True)
    with pytest.raises(ValueError, match="cache=False, but countmem://b is not on a local filesystem"):
        VolumeDataset("countmem://b", cache=False)
    with pytest.raises(ValueError, match="give rank and world_size together"):
        VolumeDataset(root, rank=1)
    with pytest.raises(ValueError, match=r"cache_limit='lots'"):
        VolumeDataset("countmem://b", cache_limit="lots")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        VolumeDataset(root, cache_limit="1GB")
    assert any("have no effect" in str(w.message) for w in caught)


# ---- real ranks ---------------------------------------------------------------------------------------------


def run_ranks(airhost, ranks: int, *args, env=None):
    argv = [READ_RANKS, "--accelerators", str(ranks), "--", *map(str, args)]
    run = airhost(*argv, env=env, timeout=120)
    if run.rc != 0 and torch_exit_abort(run.err):  # torch's exit-time race (see _helpers): once more
        run = airhost(*argv, env=env, timeout=120)
    return run


def reports(out: Path, ranks: int) -> list:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]


def test_two_ranks_with_two_workers_each_read_every_file_once_per_epoch_through_one_shared_cache(airhost, tmp_path):
    names = [f"d{i % 3}/{i:02d}.bin" for i in range(11)]
    root = make_tree(tmp_path / "src", names, size=300)
    out, cache, log = tmp_path / "out", tmp_path / "cache", tmp_path / "opens.log"
    out.mkdir()
    run = run_ranks(airhost, 2, f"countfile://{root}", out, "--workers", "2,2", "--epochs", "2", "--shuffle",
                    "--cache-dir", cache, env={"OPEN_LOG": str(log)})
    run.assert_rc(0)
    got = reports(out, 2)
    base = str(cache / "files")
    assert [g["len"] for g in got] == [6, 5]  # 11 files: the first rank gets the extra one
    orders = []
    for epoch in range(2):
        per_rank = [rel(g["epochs"][epoch], base) for g in got]
        assert [len(p) for p in per_rank] == [6, 5]
        assert sorted(per_rank[0] + per_rank[1]) == sorted(names), f"epoch {epoch}: not each file once"
        orders.append(per_rank)
    assert orders[0] != orders[1], "shuffle did not change with the epoch"
    # Each file was copied once, by one of the 4 worker processes, and reused in epoch 2 by
    # whichever process got it then.
    opened = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert sorted(opened) == sorted(str(root / n) for n in names)
    assert len({line.split(" ", 1)[0] for line in log.read_text().splitlines()}) == 4
    assert _cached_files(cache) == {n: (root / n).read_bytes() for n in names}
    assert not os.listdir(cache / ".tmp")
    # the ranks compared their settings through the run directory
    records = sorted((run.run_dir / "datasets").glob("*-epoch*/rank-*.json"))
    assert len(records) == 4, records
    assert {json.loads(p.read_text())["num_workers"] for p in records} == {2}


def test_three_ranks_with_zero_or_one_worker_split_uneven_files_and_drop_last_evens_them(airhost, tmp_path):
    names = [f"{i:02d}.bin" for i in range(10)]
    root = make_tree(tmp_path / "src", names)
    out = tmp_path / "out"
    out.mkdir()
    run = run_ranks(airhost, 3, root, out, "--workers", "0,1,1", "--drop-last-epoch")
    run.assert_rc(0)
    got = reports(out, 3)
    assert [g["workers"] for g in got] == [0, 1, 1]
    per_rank = [rel(g["epochs"][0], root) for g in got]
    assert per_rank == [names[0::3], names[1::3], names[2::3]]  # unshuffled: ranks take turns
    assert [g["len"] for g in got] == [4, 3, 3]
    dropped = [rel(g["drop_last"], root) for g in got]
    assert [len(d) for d in dropped] == [g["len_drop_last"] for g in got] == [3, 3, 3]
    assert len(set(f for d in dropped for f in d)) == 9


def test_ranks_with_different_num_workers_fail_with_a_clear_error(airhost, tmp_path):
    root = make_tree(tmp_path / "src", NAMES)
    out = tmp_path / "out"
    out.mkdir()
    run = run_ranks(airhost, 2, root, out, "--workers", "2,0")
    assert run.rc != 0, run.describe()
    text = run.out + run.err
    assert "the ranks of this run disagree in epoch 0" in text, run.describe()
    assert "rank 0 has num_workers=2, rank 1 has num_workers=0" in text, run.describe()
    assert "Give every rank's DataLoader the same num_workers" in text
    assert not (out / "rank-0.json").exists() or not (out / "rank-1.json").exists()

"""VolumeDataset: the files under a directory or fsspec URL as a torch IterableDataset that
every rank and DataLoader worker of a run reads a disjoint part of.

Why an IterableDataset that partitions itself instead of a map-style dataset with a
DistributedSampler: a sampler lives in the main process and hands out indices, so the
worker that opens the file cannot also be the one that copies it from remote storage while
the others train. Here every DataLoader worker owns its files end to end (list, copy into
the node's cache, yield the local path), which is what makes remote datasets fast.

How the files of an epoch are split (all of it computed, never communicated, so every
process arrives at the same answer on its own):

    order   = range(N), or the permutation DistributedSampler would use (seed + epoch)
    rest    = order[position:]             position: where a resumed epoch continues
    rest    = rest with the remainder dropped (drop_last) or padded (pad) to a multiple of R
    shard_r = rest[r::R]                   rank r of R
    worker w of W takes blocks w, w+W, w+2W, ... of batch_size consecutive files of shard_r

Ranks first, then workers: which files a rank reads never depends on how many workers it
has. The block split makes DataLoader's round-robin over the workers hand the rank its
shard in order, so "this rank has taken k files" is a complete position for resuming.
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import math
import multiprocessing
import os
import re
import stat
import uuid
import warnings
from collections import deque
from datetime import datetime
from multiprocessing.context import get_spawning_popen
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._cache import FileCache, _with_message

__all__ = ["VolumeDataset"]

# Slots of the shared-memory array that the dataset object of a rank's main process shares
# with its DataLoader workers (persistent ones included: set_epoch and load_state_dict reach
# them, and the main process learns that workers, not itself, are reading). A resume
# position serves one pass: worker w of a pass reads it, then raises flag _READ + w, and
# whichever worker then finds all W flags raised clears the position and the flags. Clearing
# it when a worker finishes instead would race with a sibling that has not started yet
# (spawned workers take seconds). Flags, not a counter, because a counter needs a lock, and
# a multiprocessing lock made in a fork context cannot go to spawned workers.
_EPOCH, _RESUME, _PASS_START, _IN_WORKERS, _READ = range(5)
_MAX_FLAGS = 1024

_STATE_VERSION = 1
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


# ---- sources ------------------------------------------------------------------------------


class _LocalSource:
    """A directory (or file) of this machine, read without fsspec."""

    is_local = True

    def __init__(self, path: str):
        self.root = os.path.abspath(os.path.expanduser(path))
        self.display = str(path)
        self.key = "file://" + self.root
        self._base = self.root

    def list(self, include_hidden: bool) -> Tuple[List[Tuple[str, int, Optional[float]]], int]:
        if not os.path.exists(self.root):
            hint = f" (the link points to {os.readlink(self.root)!r})" if os.path.islink(self.root) else ""
            raise FileNotFoundError(
                f"VolumeDataset: {self.display} does not exist{hint}; give the directory that holds the "
                f"files (a relative path is resolved from {os.getcwd()})."
            )
        if not os.path.isdir(self.root):
            self._base = os.path.dirname(self.root)
            st = os.stat(self.root)
            return [(os.path.basename(self.root), st.st_size, st.st_mtime)], 0

        def fail(error: OSError) -> None:
            raise _with_message(error, f"VolumeDataset: cannot list {error.filename} under {self.display}: {error}")

        found: List[Tuple[str, int, Optional[float]]] = []
        hidden = 0
        for dirpath, dirnames, filenames in os.walk(self.root, onerror=fail):
            if not include_hidden:
                hidden += sum(1 for d in dirnames if d.startswith("."))
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if not include_hidden and name.startswith("."):
                    hidden += 1
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                try:
                    st = os.stat(full)
                except FileNotFoundError as e:
                    if os.path.islink(full):
                        raise FileNotFoundError(
                            f"VolumeDataset: {full} is a symbolic link to {os.readlink(full)!r}, which does "
                            "not exist; restore its target, remove the link, or leave it out with pattern= / "
                            "suffixes=."
                        ) from e
                    continue  # removed while we listed: it is not part of the dataset
                except OSError as e:
                    raise _with_message(e, f"VolumeDataset: cannot stat {full}: {e}") from e
                if stat.S_ISREG(st.st_mode):
                    found.append((rel, st.st_size, st.st_mtime))
        return found, hidden

    def local_path(self, rel: str) -> str:
        return os.path.join(self._base, *rel.split("/"))

    def name(self, rel: str) -> str:
        return self.local_path(rel)

    def open(self, rel: str):
        return open(self.local_path(rel), "rb")


class _FsspecSource:
    """A URL with a protocol, read through fsspec (imported only here)."""

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]]):
        self.display = url
        protocol = url.split("://", 1)[0]
        try:
            import fsspec
        except ImportError as e:
            raise ImportError(
                f"VolumeDataset: {url!r} is a URL, and reading URLs needs fsspec: pip install fsspec "
                "(plus the package of the storage: s3fs for s3://, gcsfs for gs://, adlfs for az://)."
            ) from e
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except ImportError as e:
            raise ImportError(f"VolumeDataset: fsspec cannot open {protocol}:// URLs here: {e}") from e
        except ValueError as e:
            if "protocol" in str(e).lower():
                raise ValueError(
                    f"VolumeDataset: fsspec knows no filesystem for {protocol}:// ({e}); check the URL, or "
                    "install the package that provides it."
                ) from e
            raise
        from fsspec.implementations.local import LocalFileSystem

        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = root.rstrip("/") or "/"
        self._base = self.root
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.key = f"{protocols[0]}://{self.root}"

    def list(self, include_hidden: bool) -> Tuple[List[Tuple[str, int, Optional[float]]], int]:
        if not self.fs.exists(self.root):
            raise FileNotFoundError(
                f"VolumeDataset: {self.display} does not exist; check the URL (and storage_options= for "
                "credentials: a store may also answer 'not found' when access is denied)."
            )
        if self.fs.isfile(self.root):
            info = self.fs.info(self.root)
            self._base = self.root.rsplit("/", 1)[0]
            return [(self.root.rsplit("/", 1)[-1], int(info.get("size") or 0), _info_mtime(info))], 0
        found: List[Tuple[str, int, Optional[float]]] = []
        hidden = 0
        prefix = self.root.rstrip("/") + "/"
        for name, info in self.fs.find(self.root, detail=True, withdirs=False).items():
            if info.get("type", "file") != "file" or not name.startswith(prefix):
                continue
            rel = name[len(prefix):]
            if not include_hidden and any(part.startswith(".") for part in rel.split("/")):
                hidden += 1
                continue
            found.append((rel, int(info.get("size") or 0), _info_mtime(info)))
        return found, hidden

    def local_path(self, rel: str) -> str:
        assert self.is_local
        return self.name(rel)

    def name(self, rel: str) -> str:
        return self._base.rstrip("/") + "/" + rel

    def open(self, rel: str):
        return self.fs.open(self.name(rel), "rb")


def _info_mtime(info: Dict[str, Any]) -> Optional[float]:
    """The modification time of an fsspec listing entry; each store names it differently."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


# ---- helpers ------------------------------------------------------------------------------


def _cache_root() -> str:
    env = os.environ.get("AIRHOST_CACHE_DIR")
    if env:
        return os.path.expanduser(env)
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "airhost")


def _parse_size(value: Union[int, str, None]) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("cache_limit must be a number of bytes or a size such as '20GB', not a bool")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]I?B?|B)?", value.strip().upper().replace(" ", ""))
        if match is None:
            raise ValueError(f"cache_limit={value!r}: write bytes as an int or a size such as '500MB' or '20GiB'")
        digits, unit = match.group(1), match.group(2) or ""
        if unit.endswith("I"):
            unit += "B"
        number = int(float(digits) * _UNITS[unit])
    else:
        raise TypeError(f"cache_limit must be an int or a str, not {type(value).__name__}")
    if number <= 0:
        raise ValueError(f"cache_limit must be positive, got {value!r}")
    return number


def _dist_rank_world() -> Optional[Tuple[int, int]]:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _even(rest: List[int], world: int, drop_last: bool, pad: bool) -> List[int]:
    remainder = len(rest) % world
    if remainder == 0 or not rest:
        return rest
    if drop_last:
        return rest[: len(rest) - remainder]
    if pad:  # as DistributedSampler: repeat from the start
        need = world - remainder
        return rest + (rest * math.ceil(need / len(rest)))[:need]
    return rest


def _blocks(shard: List[int], worker: int, workers: int, block: int) -> List[int]:
    mine: List[int] = []
    for start in range(worker * block, len(shard), workers * block):
        mine.extend(shard[start:start + block])
    return mine


def _agreement_scope() -> Optional[str]:
    """A directory every rank of this run on this node sees, and no other run: airhost's run
    directory, else one derived from torchrun's run id and rendezvous address."""
    run_dir = os.environ.get("AIRHOST_RUN_DIR")
    if run_dir:
        return os.path.join(run_dir, "datasets")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        parts = [run_id] + [os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]
        return os.path.join(_cache_root(), "agreements", digest)
    return None


#: What every rank must agree on, and what to do when they do not.
_AGREED = {
    "world_size": "Every rank must see the same world size.",
    "num_workers": (
        "Give every rank's DataLoader the same num_workers (0 and 1 count as the same). The files of a "
        "rank do not depend on it, but each worker batches its own share, so ranks with different "
        "num_workers make different numbers of batches: DDP ranks would run different numbers of steps "
        "and hang at the end of the epoch."
    ),
    "num_files": "The ranks listed different files: keep the files unchanged while a run reads them.",
    "files_digest": "The ranks listed different files: keep the files unchanged while a run reads them.",
    "shuffle": "Build the dataset with the same arguments on every rank.",
    "seed": "Build the dataset with the same seed on every rank.",
    "drop_last": "Build the dataset with the same arguments on every rank.",
    "pad": "Build the dataset with the same arguments on every rank.",
    "batch_size": "Build the dataset with the same arguments on every rank.",
    "position": "The ranks resume from different positions: load the same state_dict() on every rank.",
}


# ---- the dataset --------------------------------------------------------------------------


class VolumeDataset(IterableDataset):
    """The files under `path` (a directory, or an fsspec URL such as `s3://bucket/train`,
    `file:///data`, `memory://x`), yielded as local file paths (str), each file exactly once
    per epoch over all ranks and DataLoader workers.

    Selection: files are listed once, recursively, when the dataset is built (so a missing
    path fails here, in the main process, not later in a worker), sorted by their path
    relative to `path`. `pattern` (a glob or a list of globs, matched against that relative
    path, `*` crossing '/') and `suffixes` (case-insensitive) select some; names starting with
    '.' (files and directories) are skipped unless `include_hidden`.

    Order and partition: `shuffle`/`seed` with `set_epoch(epoch)` as DistributedSampler (the
    same permutation). Rank and world size come from `rank`/`world_size`, else
    torch.distributed when initialised, else the RANK/WORLD_SIZE variables, else 0 of 1.
    When the number of files is not a multiple of the world size, by default the first ranks
    get one file more (every file is read once); DDP, which needs the same number of steps on
    every rank, wants `drop_last=True` (the epoch's last files are left out; with shuffling,
    different ones each epoch) or `pad=True` (files from the start of the epoch are read
    twice, as DistributedSampler does).

    `batch_size`: give the DataLoader's batch_size here too. Workers then take the rank's
    files in blocks of that size, so DataLoader hands every rank its files in order whatever
    num_workers is, and `state_dict(consumed=...)` can say exactly where the rank is.

    Local copies: files of a non-local filesystem are copied into `cache_dir` on first use
    and reused by later epochs, other workers and other ranks of the node (`cache=True` also
    copies local ones, e.g. from a slow network mount). `cache_limit` (bytes, or '20GB')
    bounds it, evicting the least recently used copies; a file is never evicted while one of
    the last `batch_size` files its iterator yielded. Between the yield and the moment your
    code opens a path, a file in a DataLoader prefetch queue is protected only by being among
    the most recently used: keep cache_limit well above ranks x workers x prefetch x
    batch_size files, or pass `transform=` (called on each path inside the worker, its result
    is yielded instead) to read each file while it is still pinned.

    The node's ranks compare their settings at the start of each epoch (airhost's run
    directory, or torchrun's run id, says which processes are one run): different
    num_workers, seeds, listings or resume positions fail with an error that says which
    ranks differ (`check_ranks=False` turns this off).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        pattern: Union[str, Sequence[str], None] = None,
        suffixes: Union[str, Sequence[str], None] = None,
        include_hidden: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool = False,
        batch_size: int = 1,
        transform: Optional[Callable[[str], Any]] = None,
        cache: Optional[bool] = None,
        cache_dir: Union[str, "os.PathLike[str]", None] = None,
        cache_limit: Union[int, str, None] = None,
        storage_options: Optional[Dict[str, Any]] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        check_ranks: bool = True,
    ):
        super().__init__()
        if drop_last and pad:
            raise ValueError("drop_last=True and pad=True contradict each other: choose one")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if (rank is None) != (world_size is None):
            raise ValueError("give rank and world_size together, or neither (then they come from torch.distributed)")
        if world_size is not None:
            _check_rank(rank, world_size, "the rank= and world_size= arguments")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")

        text = os.fspath(path)
        if not isinstance(text, str) or not text:
            raise ValueError(f"path must be a non-empty str or os.PathLike, got {path!r}")
        self._source: Union[_LocalSource, _FsspecSource]
        if "://" in text:
            self._source = _FsspecSource(text, storage_options)
        else:
            if storage_options:
                raise ValueError("storage_options= only applies to URLs (s3://..., gs://...), not local paths")
            self._source = _LocalSource(text)

        listed, hidden = self._source.list(include_hidden)
        patterns = [pattern] if isinstance(pattern, str) else list(pattern or [])
        wanted = tuple(s.lower() for s in ([suffixes] if isinstance(suffixes, str) else list(suffixes or [])))
        kept = [e for e in listed
                if (not patterns or any(fnmatch.fnmatchcase(e[0], p) for p in patterns))
                and (not wanted or e[0].lower().endswith(wanted))]
        kept.sort(key=lambda e: e[0])
        if not kept:
            raise ValueError(_no_files_message(self._source.display, listed, hidden, pattern, suffixes))
        self._files = [e[0] for e in kept]
        self._sizes = [e[1] for e in kept]
        self._mtimes = [e[2] for e in kept]
        digest = hashlib.sha256()
        for rel, size in zip(self._files, self._sizes):
            digest.update(f"{rel}\0{size}\n".encode())
        self._digest = digest.hexdigest()[:32]
        self._key = hashlib.sha256(
            json.dumps([self._source.key, patterns, wanted, include_hidden]).encode()).hexdigest()

        if cache is None:
            cache = not self._source.is_local
        elif not cache and not self._source.is_local:
            raise ValueError(
                f"VolumeDataset: cache=False, but {text} is not on a local filesystem, so its files have no "
                "local path to yield; leave cache= unset (or True)."
            )
        limit = _parse_size(cache_limit)
        self._cache: Optional[FileCache] = None
        if cache:
            directory = os.fspath(cache_dir) if cache_dir is not None else os.path.join(
                _cache_root(), "datasets", hashlib.sha256(self._source.key.encode()).hexdigest()[:16])
            if limit is not None:
                largest = max(range(len(self._files)), key=self._sizes.__getitem__)
                if self._sizes[largest] > limit:
                    raise ValueError(
                        f"VolumeDataset: cache_limit={cache_limit!r} ({limit} bytes) is smaller than "
                        f"{self._files[largest]!r} ({self._sizes[largest]} bytes), the largest file to copy into "
                        "the cache. Raise cache_limit well above it: the cache must hold every file being read "
                        "on this node at once (ranks x DataLoader workers x batch), and more to be reused."
                    )
            self._cache = FileCache(directory, limit)
            self._cache.prepare(self._source.key)
        elif cache_dir is not None or limit is not None:
            warnings.warn(
                f"VolumeDataset: {text} is read in place (cache=False, or a local path), so cache_dir= and "
                "cache_limit= have no effect; pass cache=True to copy its files.", stacklevel=2)

        self._shuffle = bool(shuffle)
        self._seed = seed
        self._drop_last = bool(drop_last)
        self._pad = bool(pad)
        self._batch_size = batch_size
        self._transform = transform
        self._explicit = (rank, world_size) if world_size is not None else None
        self._dist_hint: Optional[Tuple[int, int]] = None
        self._check_ranks = bool(check_ranks)
        self._shm = multiprocessing.RawArray("q", _READ + _MAX_FLAGS)
        self._local: Optional[List[int]] = None  # [pass start, files yielded] of a main-process pass
        self._order_cache: Tuple[int, List[int]] = (-1, [])

    # ---- what it is -----------------------------------------------------------------------

    @property
    def files(self) -> List[str]:
        """The selected files, relative to `path`, in their unshuffled order."""
        return list(self._files)

    @property
    def cache_dir(self) -> Optional[str]:
        """Where local copies go, or None when files are read in place."""
        return self._cache.directory if self._cache is not None else None

    @property
    def epoch(self) -> int:
        return int(self._shm[_EPOCH])

    def __repr__(self) -> str:
        return (f"VolumeDataset({self._source.display!r}, files={len(self._files)}, shuffle={self._shuffle}, "
                f"epoch={self.epoch}, cache_dir={self.cache_dir!r})")

    def __len__(self) -> int:
        """Files this rank reads in a whole epoch, all its workers together (what DataLoader
        and Lightning use for len(loader))."""
        rank, world = self._rank_world()
        n = len(self._files)
        if self._drop_last:
            return n // world
        if self._pad:
            return math.ceil(n / world)
        return n // world + (1 if rank < n % world else 0)

    # ---- epochs and positions -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation. Call it on every rank before each epoch, as with
        DistributedSampler; DataLoader workers, persistent ones too, see it at their next
        pass. Setting the epoch a state was loaded for keeps that resume position."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        if epoch != self._shm[_EPOCH]:
            self._set_position(epoch, 0)

    def state_dict(self, consumed: Optional[int] = None) -> Dict[str, Any]:
        """Where this epoch stands, to save in a checkpoint and give to load_state_dict().

        Without DataLoader workers (num_workers=0) the dataset counts what it yielded, which
        at a step boundary is what the loop consumed. With workers, this object does not see
        their progress, and they run ahead of the loop (prefetching): pass `consumed`, the
        number of files the loop has taken from the DataLoader since its current iterator
        began (steps x batch_size). It is exact when the dataset's batch_size is the
        DataLoader's. The position assumes every rank consumed as many files, as DDP's
        lockstep ensures, which is why any rank's state resumes all of them, at any world
        size."""
        _, world = self._rank_world()
        if consumed is None:
            if self._shm[_IN_WORKERS]:
                raise ValueError(
                    "VolumeDataset.state_dict(): this dataset is read by DataLoader workers, which run ahead of "
                    "your loop and whose progress this process does not see; pass consumed= the number of "
                    "files your loop has taken from the DataLoader since its iterator began "
                    "(steps x batch_size)."
                )
            if self._local is None:
                position = int(self._shm[_RESUME])
            else:
                position = self._local[0] + self._local[1] * world
        else:
            if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
                raise ValueError(f"consumed must be a non-negative int, got {consumed!r}")
            position = int(self._shm[_PASS_START]) + consumed * world
        return {
            "version": _STATE_VERSION,
            "epoch": int(self._shm[_EPOCH]),
            "position": min(position, len(self._files)),
            "num_files": len(self._files),
            "files_digest": self._digest,
            "shuffle": self._shuffle,
            "seed": self._seed,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next pass over `state["epoch"]` continue after the files already read,
        on every rank (DataLoader workers included). Refuses a state of another file listing
        or order, which would silently read other files."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError("VolumeDataset.load_state_dict(): not a state from VolumeDataset.state_dict()")
        if state["num_files"] != len(self._files) or state["files_digest"] != self._digest:
            raise ValueError(
                f"VolumeDataset.load_state_dict(): the state was saved over {state['num_files']} files, and "
                f"{self._source.display} now holds {len(self._files)} selected files"
                + (" (the same number, but other names or sizes)" if state["num_files"] == len(self._files) else "")
                + ": resuming would read other files than the ones left. Resume with the same files, or "
                "start the epoch over (skip load_state_dict)."
            )
        if state["shuffle"] != self._shuffle or state["seed"] != self._seed:
            raise ValueError(
                f"VolumeDataset.load_state_dict(): the state was saved with shuffle={state['shuffle']}, "
                f"seed={state['seed']}, this dataset has shuffle={self._shuffle}, seed={self._seed}: the files "
                "left would not be the ones not yet read. Build the dataset with the saved settings."
            )
        position = state["position"]
        if not isinstance(position, int) or not 0 <= position <= len(self._files):
            raise ValueError(f"VolumeDataset.load_state_dict(): bad position {position!r}")
        self._set_position(state["epoch"], position)

    def _set_position(self, epoch: int, position: int) -> None:
        shm = self._shm
        shm[_EPOCH] = epoch
        shm[_RESUME] = position
        shm[_PASS_START] = position
        shm[_READ:_READ + _MAX_FLAGS] = [0] * _MAX_FLAGS
        self._local = None

    # ---- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # Not a generator itself: bad settings fail at iter(), in the worker's start-up.
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank_world()
        num_workers = info.num_workers if info is not None else 0
        shm = self._shm
        epoch, start = int(shm[_EPOCH]), int(shm[_RESUME])
        shm[_PASS_START] = start
        shm[_IN_WORKERS] = 1 if info is not None else 0
        if start and workers <= _MAX_FLAGS:  # beyond that, set_epoch() alone ends a resume
            shm[_READ + worker] = 1
            if all(shm[_READ:_READ + workers]):  # every process of this pass has read it
                shm[_RESUME] = 0
                shm[_READ:_READ + workers] = [0] * workers
        if self._check_ranks and world > 1:
            self._agree(rank, world, num_workers, epoch, start)
        rest = _even(self._order(epoch)[start:], world, self._drop_last, self._pad)
        mine = _blocks(rest[rank::world], worker, workers, self._batch_size)
        counter = None
        if info is None:
            counter = self._local = [start, 0]
        return self._generate(mine, counter)

    def _generate(self, indices: List[int], counter: Optional[List[int]]) -> Iterator[Any]:
        pins: deque = deque()
        try:
            for i in indices:
                rel = self._files[i]
                if self._cache is not None:
                    while len(pins) >= self._batch_size:  # the oldest of the last batch_size files
                        os.close(pins.popleft())
                    path, fd = self._cache.acquire(rel, self._sizes[i], self._mtimes[i],
                                                   functools.partial(self._source.open, rel), self._source.name(rel))
                    pins.append(fd)
                else:
                    path = self._source.local_path(rel)
                    try:
                        os.stat(path)
                    except OSError as e:
                        raise _with_message(
                            e,
                            f"VolumeDataset: {path} was listed when the dataset was built but cannot be read now "
                            f"({e}). Files must stay while a run reads them; build a new VolumeDataset to list "
                            "them again.",
                        ) from e
                if counter is not None:
                    counter[1] += 1
                yield self._transform(path) if self._transform is not None else path
        finally:
            for fd in pins:
                os.close(fd)

    def _order(self, epoch: int) -> List[int]:
        if self._order_cache[0] == epoch:
            return self._order_cache[1]
        n = len(self._files)
        if self._shuffle:
            generator = torch.Generator()
            generator.manual_seed(self._seed + epoch)
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = list(range(n))
        self._order_cache = (epoch, order)
        return order

    def _rank_world(self) -> Tuple[int, int]:
        if self._explicit is not None:
            return self._explicit
        found = _dist_rank_world() or self._dist_hint
        if found is not None:
            return found
        rank_text, world_text = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank_text is None and world_text is None:
            return 0, 1
        try:
            rank, world = int(rank_text or ""), int(world_text or "")
        except ValueError:
            raise ValueError(
                f"VolumeDataset: RANK={rank_text!r} and WORLD_SIZE={world_text!r} in the environment are not "
                "both integers; fix them, or pass rank= and world_size=."
            ) from None
        _check_rank(rank, world, "RANK and WORLD_SIZE in the environment")
        return rank, world

    def _agree(self, rank: int, world: int, num_workers: int, epoch: int, start: int) -> None:
        """Each process records its rank's settings for this epoch in the run's directory and
        compares them with the other ranks' records. A rank keeps the record of its first
        pass over an epoch (a second DataLoader over the same epoch with other settings is
        not compared); of two ranks that differ, the one that records last always sees the
        other, so at least one fails, and the launcher then stops the rest."""
        scope = _agreement_scope()
        if scope is None:
            return
        record = {"rank": rank, "world_size": world, "num_workers": num_workers, "num_files": len(self._files),
                  "files_digest": self._digest, "shuffle": self._shuffle, "seed": self._seed,
                  "drop_last": self._drop_last, "pad": self._pad, "batch_size": self._batch_size,
                  "position": start}
        folder = os.path.join(scope, f"{self._key[:16]}-epoch{epoch}")
        mine = os.path.join(folder, f"rank-{rank}.json")
        tmp = f"{mine}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(record, f)
            try:
                os.link(tmp, mine)  # the first record of a rank wins, whole
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            with open(mine) as f:
                if json.load(f) != record:
                    return
            records = {}
            for name in os.listdir(folder):
                if name.startswith("rank-") and name.endswith(".json"):
                    with open(os.path.join(folder, name)) as f:
                        other = json.load(f)
                    records[other["rank"]] = other
        except (OSError, ValueError) as e:
            warnings.warn(f"VolumeDataset: cannot compare settings with the other ranks in {scope} ({e}); "
                          "going on without the check", RuntimeWarning, stacklevel=3)
            return
        problems = []
        for key, advice in _AGREED.items():
            values = {r: rec.get(key) for r, rec in sorted(records.items())}
            compared = [max(1, v) if key == "num_workers" and isinstance(v, int) else v for v in values.values()]
            if len(set(map(json.dumps, compared))) > 1:
                if key == "files_digest" and "num_files" in [p[0] for p in problems]:
                    continue
                shown = ", ".join(f"rank {r} has {key}={v}" for r, v in values.items())
                problems.append((key, f"{shown}. {advice}"))
        if problems:
            raise RuntimeError(
                f"VolumeDataset over {self._source.display}: the ranks of this run disagree in epoch {epoch}: "
                + " ".join(text for _, text in problems)
            )

    # ---- pickling (spawned DataLoader workers, @distributed arguments) ---------------------

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        if get_spawning_popen() is None:
            # Only a process being spawned may inherit the shared memory; anything else
            # (torch.save, cloudpickle to airhost's ranks) gets a copy of the values.
            state["_shm"] = list(self._shm)
        # A spawned worker does not inherit torch.distributed; it gets the rank from here.
        state["_dist_hint"] = _dist_rank_world() or self._dist_hint
        state["_order_cache"] = (-1, [])
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if isinstance(state["_shm"], list):
            values = state["_shm"]
            state["_shm"] = multiprocessing.RawArray("q", len(values))
            state["_shm"][:] = values
        self.__dict__.update(state)


def _check_rank(rank: Any, world: Any, where: str) -> None:
    ok = (isinstance(rank, int) and isinstance(world, int) and not isinstance(rank, bool)
          and not isinstance(world, bool) and world >= 1 and 0 <= rank < world)
    if not ok:
        raise ValueError(f"VolumeDataset: {where} give rank={rank!r} of world_size={world!r}; "
                         "a rank is 0 <= rank < world_size")


def _no_files_message(display: str, listed, hidden: int, pattern, suffixes) -> str:
    if not listed:
        extra = (f" ({hidden} hidden name(s), starting with '.', were skipped: include_hidden=True reads them)"
                 if hidden else "")
        return f"VolumeDataset: {display} holds no files{extra}; check the path."
    examples = ", ".join(repr(e[0]) for e in sorted(listed)[:3])
    chosen = ", ".join(f"{k}={v!r}" for k, v in (("pattern", pattern), ("suffixes", suffixes)) if v is not None)
    return (f"VolumeDataset: no file under {display} matches {chosen} (it holds {len(listed)} file(s), such as "
            f"{examples}); fix the filter. pattern= is matched against the path relative to {display}.")

"""Checkpoints for torch.distributed.checkpoint that are either complete or invisible.

    dcp.save(state, storage_writer=VolumeWriter(os.path.join(root, f"step-{step:06d}")))
    dcp.async_save(state, storage_writer=VolumeWriter(...), process_group=gloo_group)
    path = latest_checkpoint(root)          # newest complete checkpoint, or None
    dcp.load(state, storage_reader=VolumeReader(path))

The file format is torch's own (FileSystemWriter/FileSystemReader do the serialising; this
module only changes *where* bytes go before they are published and *when* a checkpoint
becomes visible), so torch's plain FileSystemReader loads what VolumeWriter wrote.

The publish protocol, and why a crash never leaves a checkpoint that looks valid:

1. Coordinator, before any rank writes (prepare_global_plan runs on rank 0 between the gather
   of the local plans and the scatter of the global plan, and every rank's write_data waits
   for that scatter): an existing `.metadata` in the destination is removed and the directory
   fsynced. Saving over an old checkpoint therefore makes it invalid first; without this a
   crash halfway would leave the old `.metadata` pointing at a mix of old and new shards.
   Staging leftovers of earlier crashed saves are removed at the same point.
2. Every rank, in write_data: each shard file is written under a hidden staging name
   (`.__1_0.distcp.<id>.staging`) in the destination directory, fsynced, renamed into place
   (atomic within one filesystem), and the directory fsynced. A rank killed mid-write leaves
   a staging file, never a truncated shard under its real name. For an fsspec destination
   the shard is written to a local staging file first, uploaded under a staging name, then
   moved to its real name.
3. Coordinator, in finish (called only after the gather of every rank's write results, which
   each rank sends only once its shards are published): it checks that every file the
   results reference is there with all its bytes, then writes `.metadata` under a staging
   name, fsyncs it, renames it into place and fsyncs the directory. `.metadata` is the commit
   point: if any rank died before sending its results, finish never runs and no `.metadata`
   exists, so latest_checkpoint() and VolumeReader refuse the directory.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _FsspecFileSystem
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
)

__all__ = ["VolumeWriter", "VolumeReader", "latest_checkpoint"]

METADATA = ".metadata"
_STAGING_SUFFIX = ".staging"
_WRITE_MODES = "wax+"


# ---- where a checkpoint lives: a local directory or an fsspec URL ---------------------------


class _Location:
    """A path resolved once: `file://` and other URLs that fsspec maps to the local filesystem
    become plain local paths, so they get real atomic renames and fsync; anything else keeps
    its URL and an fsspec filesystem."""

    def __init__(self, path: str | os.PathLike, storage_options: dict | None = None):
        text = os.fspath(path)
        if not isinstance(text, str):
            text = os.fsdecode(text)
        self.given = text
        self.storage_options = dict(storage_options or {})
        self.fs = None  # None: local
        self.path = text
        if "://" in text or "::" in text:
            from fsspec.core import url_to_fs
            from fsspec.implementations.local import LocalFileSystem

            fs, stripped = url_to_fs(text, **(storage_options or {}))
            if isinstance(fs, LocalFileSystem):
                self.path = stripped
            else:
                self.fs = fs
                self.path = text.rstrip("/")

    @property
    def local(self) -> bool:
        return self.fs is None

    def join(self, *names: str) -> str:
        names = tuple(n for n in names if n)
        if self.local:
            return os.path.join(self.path, *names)
        return "/".join([self.path, *names])

    def exists(self, p: str) -> bool:
        return os.path.exists(p) if self.local else self.fs.exists(p)

    def isdir(self, p: str) -> bool:
        return os.path.isdir(p) if self.local else self.fs.isdir(p)

    def subdirs(self) -> list[str]:
        """Names of the directories directly under this location."""
        if self.local:
            with os.scandir(self.path) as it:
                return sorted(e.name for e in it if e.is_dir())
        return sorted(
            e["name"].rstrip("/").rsplit("/", 1)[-1]
            for e in self.fs.ls(self.path, detail=True)
            if e.get("type") == "directory"
        )

    def size(self, p: str) -> int | None:
        try:
            return os.stat(p).st_size if self.local else self.fs.size(p)
        except (OSError, ValueError):
            return None

    def mtime(self, p: str) -> float:
        if self.local:
            return os.stat(p).st_mtime
        info = self.fs.info(p)
        for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
            value = info.get(key)
            if value is None:
                continue
            if hasattr(value, "timestamp"):
                return value.timestamp()
            try:
                return float(value)
            except (TypeError, ValueError):
                continue
        return 0.0

    def open(self, p: str) -> io.IOBase:
        return open(p, "rb") if self.local else self.fs.open(p, "rb")


def _fsync_dir(path: str | os.PathLike) -> None:
    """A rename is durable only once its directory is: fsync the directory entry itself."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (e.g. certain FUSE mounts) refuse it; nothing more to do
        pass
    finally:
        os.close(fd)


def _staging_name(name: str) -> str:
    # Hidden and suffixed, so neither torch nor a person mistakes it for a shard; unique, so
    # threads and ranks never share one.
    return f".{name}.{uuid.uuid4().hex[:12]}{_STAGING_SUFFIX}"


# ---- torch FileSystemBase implementations that stage, then publish ---------------------------


class _StagedWrites:
    """create_stream for a torch FileSystem whose written files appear under their name only
    when complete. torch's FileSystemWriter opens each shard with create_stream(path, "wb") and
    writes into it directly; here a write goes into a staging stream (_stage), which _publish
    puts in place when the `with` block ends without an exception, and _discard drops
    otherwise. Reads are the base FileSystem's."""

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if not any(c in mode for c in _WRITE_MODES):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream, staged = self._stage(path)
        try:
            yield stream
            stream.close()  # torch may have closed it already; closing twice is harmless
            self._publish(staged, path)
        except BaseException:
            stream.close()
            self._discard(staged)
            raise


class _StagedLocalFileSystem(_StagedWrites, FileSystem):
    """torch's local FileSystem, staging each written file next to its path (a hidden name)
    and renaming it onto the path, fsynced, once complete."""

    def __init__(self, sync: bool = True) -> None:
        super().__init__()
        self.sync = sync

    def _stage(self, path: str | os.PathLike) -> tuple[io.IOBase, Path]:
        final = Path(path)
        staged = final.with_name(_staging_name(final.name))
        return open(staged, "wb"), staged

    def _publish(self, staged: Path, path: str | os.PathLike) -> None:
        final = Path(path)
        if self.sync:
            # torch fsyncs shards itself when sync_files is set, but not every caller of
            # create_stream does; an fsync of an already-synced file costs nothing.
            fd = os.open(staged, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(staged, final)
        if self.sync:
            _fsync_dir(final.parent)

    def _discard(self, staged: Path) -> None:
        with contextlib.suppress(OSError):
            os.unlink(staged)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        os.replace(path, new_path)
        if self.sync:
            _fsync_dir(Path(new_path).parent)


class _StagedFsspecFileSystem(_StagedWrites, _FsspecFileSystem):
    """torch's fsspec FileSystem that writes each file locally first, then uploads it under a
    staging name and moves it into place, so a remote reader never sees a partial object
    under a real name (an interrupted upload leaves only a staging object). Module-level, so
    a writer pickles for dcp.async_save(async_checkpointer_type=PROCESS)."""

    def __init__(self, staging_dir: str | None = None) -> None:
        super().__init__()
        self.staging_dir = staging_dir

    def _stage(self, path: str | os.PathLike) -> tuple[io.IOBase, str]:
        fd, local = tempfile.mkstemp(prefix="airhost-ckpt-", suffix=_STAGING_SUFFIX, dir=self.staging_dir)
        return os.fdopen(fd, "wb"), local

    def _publish(self, local: str, path: str | os.PathLike) -> None:
        path = os.fspath(path)
        parent, _, name = path.rpartition("/")
        remote_staged = f"{parent}/{_staging_name(name)}"
        self.fs.put_file(local, remote_staged)
        try:
            self.fs.mv(remote_staged, path)
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.rm(remote_staged)
            raise
        self._discard(local)

    def _discard(self, local: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(local)


# ---- checking a checkpoint -------------------------------------------------------------------


def _read_metadata(loc: _Location, directory: str):
    with loc.open(loc.join(directory, METADATA)) as f:
        return pickle.load(f)


def _missing_files(loc: _Location, directory: str, needed: dict[str, int]) -> list[str]:
    """The files of `needed` (relative name -> bytes it must hold) absent or too short."""
    problems = []
    for name, end in sorted(needed.items()):
        size = loc.size(loc.join(directory, name))
        if size is None:
            problems.append(f"{name} (missing)")
        elif size < end:
            problems.append(f"{name} ({size} bytes, .metadata needs {end})")
    return problems


def _needed_bytes(storage_infos) -> dict[str, int]:
    needed: dict[str, int] = {}
    for info in storage_infos:
        name = getattr(info, "relative_path", None)
        if name is None:
            continue
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        needed[name] = max(needed.get(name, 0), end)
    return needed


def _checkpoint_problem(loc: _Location, directory: str) -> str | None:
    """Why `directory` is not a complete checkpoint, or None when it is one."""
    if not loc.exists(loc.join(directory, METADATA)):
        return f"no {METADATA} file: its save never finished (a crash, or a save still running)"
    try:
        metadata = _read_metadata(loc, directory)
    except Exception as e:  # a torn or foreign file: unreadable is the same as absent
        return f"its {METADATA} cannot be read ({type(e).__name__}: {e})"
    storage = getattr(metadata, "storage_data", None) or {}
    missing = _missing_files(loc, directory, _needed_bytes(storage.values()))
    if missing:
        return f"files that its {METADATA} references are missing or incomplete: {', '.join(missing)}"
    return None


# ---- latest_checkpoint -----------------------------------------------------------------------

_STEP_RE = re.compile(r"(\d+)(?!.*\d)")


def latest_checkpoint(root: str | os.PathLike, *, storage_options: dict | None = None) -> str | None:
    """The newest complete checkpoint directly under `root` (a directory or fsspec URL), as a
    path (or URL) to hand to VolumeReader; None when there is none or `root` does not exist.
    A `file://` root gives plain local paths back.

    Complete means: `.metadata` exists, can be read, and every file it references is present
    with all the bytes it refers to. Directories that are not complete are skipped with a
    warning naming them, because a half-written checkpoint usually means a crash worth knowing
    about. Hidden directories (a leading dot) are ignored silently.

    Newest: when every complete candidate's name holds a number, the one whose last group of
    digits is highest (`step-000100` > `step-000020`, `epoch_12` > `epoch_9`; zero padding is
    not needed), ties broken by the time `.metadata` was written; otherwise the one whose
    `.metadata` was written last. Names beat times when they can because a copied or
    restored directory has fresh times but keeps its step.
    """
    loc = _Location(root, storage_options)
    if not loc.exists(loc.path):
        return None
    if not loc.isdir(loc.path):
        raise NotADirectoryError(
            f"latest_checkpoint({loc.given!r}): {loc.path} is a file, not a directory; pass the "
            f"directory that holds the checkpoint directories (e.g. the parent of step-000100)"
        )
    names = [n for n in loc.subdirs() if not n.startswith(".")]
    candidates = []
    for name in names:
        meta = loc.join(name, METADATA)
        if not loc.exists(meta):
            warnings.warn(
                f"latest_checkpoint: ignoring {loc.join(name)}: no {METADATA} file, so its save "
                f"never finished (a crash, or a save still running)",
                stacklevel=2,
            )
            continue
        try:
            written = loc.mtime(meta)
        except (OSError, FileNotFoundError):  # removed since: a save over it has begun
            continue
        m = _STEP_RE.search(name)
        candidates.append((name, int(m.group(1)) if m else None, written))
    if all(step is not None for _, step, _ in candidates):
        candidates.sort(key=lambda c: (c[1], c[2], c[0]), reverse=True)
    else:
        candidates.sort(key=lambda c: (c[2], c[0]), reverse=True)
    for name, _, _ in candidates:
        problem = _checkpoint_problem(loc, name)
        if problem is None:
            return loc.join(name)
        warnings.warn(f"latest_checkpoint: ignoring {loc.join(name)}: {problem}", stacklevel=2)
    return None


# ---- VolumeWriter ----------------------------------------------------------------------------


def _check_writable(loc: _Location) -> None:
    """Fail at construction, on every rank alike, rather than inside DCP's collectives, where
    the error would arrive wrapped in a CheckpointException after a gather."""
    if not loc.local:
        return
    target = os.path.abspath(loc.path)
    probe = target
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = "it" if probe == target else probe
        raise NotADirectoryError(
            f"cannot save a checkpoint to {loc.given}: {what} is a regular file, not a directory; "
            f"choose a path whose existing part is a directory"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(
            f"cannot save a checkpoint to {loc.given}: {probe} is not writable by this user "
            f"(uid {os.getuid()}); choose a directory you can write to"
        )


class VolumeWriter(FileSystemWriter):
    """A torch.distributed.checkpoint storage writer whose checkpoints are invisible until
    complete (see the module docstring for the protocol).

    `path`: the checkpoint's own directory (one per checkpoint, e.g. root/step-000100), local
    or an fsspec URL (`file://` is treated as local). Saving over an existing checkpoint
    invalidates it first; `overwrite=False` refuses instead. `staging_dir`: where shards bound
    for a remote URL are written before upload (default: the system temp directory).
    Everything else is FileSystemWriter's, including the staging for dcp.async_save.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = True,
        sync_files: bool = True,
        thread_count: int = 1,
        single_file_per_rank: bool = True,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        staging_dir: str | os.PathLike | None = None,
        storage_options: dict | None = None,
    ) -> None:
        super().__init__(
            os.fspath(path),
            single_file_per_rank=single_file_per_rank,
            sync_files=sync_files,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            cache_staged_state_dict=cache_staged_state_dict,
            overwrite=overwrite,
        )
        self.staging_dir = os.fspath(staging_dir) if staging_dir is not None else None
        self.storage_options = dict(storage_options or {})
        self._bind(path)

    def _bind(self, path: str | os.PathLike) -> None:
        loc = _Location(path, self.storage_options)
        _check_writable(loc)
        self._loc = loc
        if loc.local:
            self.fs = _StagedLocalFileSystem(sync=self.sync_files)
            self.path = self.fs.init_path(loc.path)
        else:
            self.fs = _StagedFsspecFileSystem(self.staging_dir)
            self.path = self.fs.init_path(loc.path, **self.storage_options)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)  # a fresh save_id
        if checkpoint_id:
            self._bind(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise ValueError(
                "VolumeWriter needs dcp.save(..., use_collectives=True) (the default): without "
                "rank coordination no rank knows when every shard is in place, so there is no "
                "safe moment to publish .metadata"
            )
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)

    def _metadata_path(self) -> str | os.PathLike:
        return self.fs.concat_path(self.path, METADATA)

    def prepare_local_plan(self, plan):
        # Replaces torch's version, which warns on every save over an existing checkpoint;
        # here replacing one is documented behaviour and made safe by prepare_global_plan.
        try:
            self.fs.mkdir(self.path)
        except OSError as e:
            raise OSError(
                e.errno,
                f"cannot create the checkpoint directory {self._loc.given}: {e.strerror or e}; "
                f"choose a writable location",
            ) from e
        if not self.overwrite and self.fs.exists(self._metadata_path()):
            raise FileExistsError(
                f"{self._loc.given} already holds a checkpoint and VolumeWriter(overwrite=False) "
                f"was asked not to replace it; save to a new directory (e.g. one per step)"
            )
        return plan

    def prepare_global_plan(self, plans):
        # Runs on the coordinator only, before any rank's write_data (which waits for the
        # scatter of these plans): the one point where unpublishing is race-free.
        metadata_path = self._metadata_path()
        if self.fs.exists(metadata_path):
            self.fs.rm_file(metadata_path)
            if self._loc.local and self.sync_files:
                _fsync_dir(self.path)
        self._remove_leftovers()
        return super().prepare_global_plan(plans)

    def _remove_leftovers(self) -> None:
        """Staging files of saves that died; no live save can own one at this point."""
        try:
            entries = self.fs.ls(self.path)
        except (OSError, FileNotFoundError):
            return
        for entry in entries:
            name = os.fspath(entry).rstrip("/").rsplit("/", 1)[-1]
            if (name.startswith(".") and name.endswith(_STAGING_SUFFIX)) or name == METADATA + ".tmp":
                with contextlib.suppress(Exception):
                    self.fs.rm_file(entry)

    def finish(self, metadata, results) -> None:
        # Every result arrived, so every rank says its shards are published; check it anyway,
        # because ranks on different nodes writing to node-local paths would otherwise publish
        # a checkpoint whose shards live elsewhere.
        needed = _needed_bytes(wr.storage_data for wrs in results for wr in wrs)
        loc = self._loc
        missing = _missing_files(loc, "", needed)
        if missing:
            raise RuntimeError(
                f"not publishing the checkpoint {loc.given}: shard files are not visible to the "
                f"coordinator: {', '.join(missing)}. Every rank must save to the same shared "
                f"directory."
            )
        super().finish(metadata, results)
        if loc.local and self.sync_files:
            _fsync_dir(os.path.dirname(os.path.abspath(self.path)))  # the checkpoint's own entry

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


# ---- VolumeReader ----------------------------------------------------------------------------


class VolumeReader(FileSystemReader):
    """A torch.distributed.checkpoint storage reader that refuses, with a message saying what
    to do, a path that is missing, holds no checkpoint, or holds an incomplete one, instead of
    letting DCP fail later inside a collective.

    `path`: a checkpoint directory (what latest_checkpoint returns), local or an fsspec URL.
    It reads any checkpoint in torch's file format, FileSystemWriter's included.
    """

    def __init__(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        super().__init__(os.fspath(path))
        self.storage_options = dict(storage_options or {})
        self._bind(path)

    def _bind(self, path: str | os.PathLike) -> None:
        loc = _Location(path, self.storage_options)
        _check_readable(loc)
        self._loc = loc
        if loc.local:
            self.fs = FileSystem()
            self.path = self.fs.init_path(loc.path)
        else:
            self.fs = _FsspecFileSystem()
            self.path = self.fs.init_path(loc.path, **self.storage_options)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self._bind(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _check_readable(loc: _Location) -> None:
    where = loc.given
    if not loc.exists(loc.path):
        raise FileNotFoundError(
            f"no checkpoint at {where}: it does not exist. Pass the directory a VolumeWriter "
            f"saved to, or find the newest one with airhost.data.latest_checkpoint(root)"
        )
    if not loc.isdir(loc.path):
        raise NotADirectoryError(
            f"no checkpoint at {where}: it is a file; a checkpoint is a directory holding "
            f"{METADATA} and .distcp shards"
        )
    if not loc.exists(loc.join(METADATA)):
        hint = "pass the directory a VolumeWriter saved to"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                newest = latest_checkpoint(loc.given, storage_options=loc.storage_options)
            except Exception:
                newest = None
        if newest is not None:
            hint = (f"it holds checkpoints in its subdirectories: latest_checkpoint({where!r}) "
                    f"returns the newest, {newest}")
        raise FileNotFoundError(
            f"no checkpoint at {where}: it has no {METADATA} file (written last, when a save "
            f"completes, so a save that crashed or is still running leaves none); {hint}"
        )
    problem = _checkpoint_problem(loc, "")
    if problem is None:
        return
    raise FileNotFoundError(
        f"the checkpoint at {where} is incomplete and cannot be loaded: {problem}. "
        f"latest_checkpoint(root) skips such checkpoints"
    )

"""The node-local copy of remote files that VolumeDataset yields.

Every rank and every DataLoader worker of a node may read the same dataset at once, and
several runs may share one cache directory, so nothing here trusts in-process state:

    <cache_dir>/files/<relative path>   the copies, under their own names, so that code that
                                         reads labels from parent directories or suffixes
                                         works on them as on the source
    <cache_dir>/.tmp/<size>.<pid>.<hex> copies in progress; the writer holds an exclusive
                                         flock on it, so a crashed copy is recognisable
    <cache_dir>/.lock                   flock serialising the size accounting and eviction
    <cache_dir>/.usage                  bytes in the cache (an estimate that only errs high;
                                         eviction rescans the directory and rewrites it)
    <cache_dir>/source                  the URL whose files these are (one per directory)

A copy is written under a temporary name and linked into place, so readers never see a
partial file and two processes copying the same file at once both succeed. A cached file's
mtime is the source's modification time (when the listing gives one) and its atime the last
time a dataset handed it out: the first tells whether the copy is current, the second is the
least-recently-used order of eviction (set explicitly, so noatime mounts do not matter).
A process that hands a file out holds a shared flock on it until it moves on; eviction only
removes files it can lock exclusively, so a file is never removed under the iterator that is
yielding it.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
import uuid
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Tuple

_CHUNK = 4 << 20
#: Unlocked temporary files younger than this may be copies whose writer has not locked them
#: yet; older ones are left-overs of a killed process and are removed.
_ORPHAN_AGE_S = 60.0
#: Eviction frees this fraction of the bound beyond what the new file needs, so that a full
#: cache rescans its directory once per tenth of its size copied in, not once per file.
_LOW_WATER = 0.1
#: A cached copy is current when its mtime is within this of the source's (all the local
#: filesystems a cache lives on keep sub-microsecond times; a coarser one just copies again).
_MTIME_SLACK_S = 1e-3


def _with_message(error: BaseException, message: str) -> OSError:
    """An OSError of the same kind as `error` (PermissionError stays PermissionError), so that
    callers can still catch by kind, carrying a message that says what to do."""
    kind = type(error) if isinstance(error, OSError) else OSError
    try:
        new = kind(message)
    except Exception:  # an OSError subclass with another constructor
        new = OSError(message)
    if isinstance(error, OSError) and error.errno is not None:
        new.errno = error.errno
    return new


class FileCache:
    """One cache directory, bounded to `limit` bytes (None: unbounded)."""

    def __init__(self, directory: str, limit: Optional[int]):
        self.directory = os.path.abspath(directory)
        self.limit = limit
        self.files_dir = os.path.join(self.directory, "files")
        self.tmp_dir = os.path.join(self.directory, ".tmp")
        self._lock_path = os.path.join(self.directory, ".lock")
        self._usage_path = os.path.join(self.directory, ".usage")
        self._warned = False

    # ---- set-up ---------------------------------------------------------------------------

    def prepare(self, source: str) -> None:
        """Fails now, in the process that built the dataset, when the directory cannot be
        used, rather than in a DataLoader worker at the first file. The copies mirror the
        layout of one source, so a directory serves one source only: `source` is recorded
        on first use and checked later."""
        try:
            os.makedirs(self.files_dir, exist_ok=True)
            os.makedirs(self.tmp_dir, exist_ok=True)
            probe = os.path.join(self.tmp_dir, f"probe.{os.getpid()}.{uuid.uuid4().hex}")
            with open(probe, "wb") as f:
                f.write(b"x")
            os.unlink(probe)
            with open(self._lock_path, "ab"):
                pass
            marker = os.path.join(self.directory, "source")
            if not os.path.exists(marker):
                tmp = f"{marker}.{os.getpid()}.{uuid.uuid4().hex}"
                with open(tmp, "w") as f:
                    f.write(source + "\n")
                try:
                    os.link(tmp, marker)  # the first dataset to use the directory names it
                except FileExistsError:
                    pass
                finally:
                    os.unlink(tmp)
            with open(marker) as f:
                recorded = f.read().strip()
        except OSError as e:
            raise _with_message(
                e,
                f"VolumeDataset: the cache directory {self.directory} cannot be used ({e}). "
                "Pass cache_dir= a writable local directory (or set AIRHOST_CACHE_DIR).",
            ) from e
        if recorded != source:
            raise ValueError(
                f"VolumeDataset: the cache directory {self.directory} holds copies of {recorded}, not of "
                f"{source}; a cache directory mirrors one source's files, so give each source its own "
                "cache_dir (or leave cache_dir unset: the default is one directory per URL)."
            )

    def local_path(self, rel: str) -> str:
        return os.path.join(self.files_dir, *rel.split("/"))

    # ---- handing files out -----------------------------------------------------------------

    def acquire(self, rel: str, size: int, mtime: Optional[float],
                opener: Callable[[], object], source_name: str) -> Tuple[str, int]:
        """The local path of a current copy of `rel`, copied first when needed, and a file
        descriptor that holds it pinned (a shared flock) until the caller closes it."""
        for _ in range(5):
            fd = self._pin(rel, size, mtime)
            if fd is not None:
                return self.local_path(rel), fd
            self._fetch(rel, size, mtime, opener, source_name)
        # Only a cache far smaller than what is in flight gets here: each copy was evicted
        # by another process before this one could pin it.
        raise OSError(
            f"VolumeDataset: {source_name} was evicted from the cache {self.directory} five times "
            "before it could be used; cache_limit is too small for the files being read at once "
            "on this node (ranks x DataLoader workers x batch): raise it."
        )

    def _pin(self, rel: str, size: int, mtime: Optional[float]) -> Optional[int]:
        path = self.local_path(rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            # Blocking: an evictor holds its exclusive lock only while it unlinks.
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            current = st.st_nlink > 0 and st.st_size == size and (
                mtime is None or abs(st.st_mtime - mtime) <= _MTIME_SLACK_S)
            if not current:
                os.close(fd)
                return None
            try:
                os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))  # last use: the LRU order
            except PermissionError:
                pass  # another user's copy in a shared cache: usable, its LRU place unchanged
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _fetch(self, rel: str, size: int, mtime: Optional[float],
               opener: Callable[[], object], source_name: str) -> None:
        self._reserve(size, rel)
        tmp = os.path.join(self.tmp_dir, f"{size}.{os.getpid()}.{uuid.uuid4().hex}")
        placed = False
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            self._release(size)
            raise self._write_error(rel, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # "in progress" for the orphan sweep
            written = self._copy(opener, fd, rel, source_name)
            if written != size:
                raise OSError(
                    f"VolumeDataset: {source_name} has {written} bytes, but {size} when the dataset "
                    "listed it: it changed while being read. Datasets must not change while they are "
                    "read; build a new VolumeDataset to list the files again."
                )
            now = time.time_ns()
            os.utime(fd, ns=(now, int(mtime * 1e9) if mtime is not None else now))
            final = self.local_path(rel)
            try:
                os.makedirs(os.path.dirname(final), exist_ok=True)
                try:
                    os.link(tmp, final)
                    placed = True
                except FileExistsError:
                    if self._is_current(final, size, mtime):
                        pass  # another process copied it first: keep theirs
                    else:
                        os.replace(tmp, final)  # a stale version: replace it
                        placed = True
            except OSError as e:
                raise self._write_error(rel, e) from e
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.close(fd)
            if not placed:
                self._release(size)

    def _copy(self, opener, fd: int, rel: str, source_name: str) -> int:
        """Copies the source into `fd`; the errors of the two sides get different advice."""
        def read_error(e: BaseException) -> OSError:
            return _with_message(
                e,
                f"VolumeDataset: cannot read {source_name}: {type(e).__name__}: {e}. Check that this "
                "process may read it (permissions, credentials, storage_options=) and that it still "
                "exists, or leave it out with pattern= / suffixes=.",
            )

        try:
            src = opener()
        except Exception as e:
            raise read_error(e) from e
        written = 0
        with src:
            while True:
                try:
                    chunk = src.read(_CHUNK)
                except Exception as e:
                    raise read_error(e) from e
                if not chunk:
                    return written
                try:
                    view = memoryview(chunk)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                except OSError as e:
                    raise self._write_error(rel, e) from e
                written += len(chunk)

    def _write_error(self, rel: str, e: OSError) -> OSError:
        hint = ("the disk is full: lower cache_limit or free space there"
                if e.errno in (errno.ENOSPC, errno.EDQUOT) else "pass cache_dir= a writable local directory")
        return _with_message(e, f"VolumeDataset: cannot write {rel!r} into the cache {self.directory} ({e}); {hint}.")

    @staticmethod
    def _is_current(path: str, size: int, mtime: Optional[float]) -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        return st.st_size == size and (mtime is None or abs(st.st_mtime - mtime) <= _MTIME_SLACK_S)

    # ---- the size bound --------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_usage(self) -> Optional[int]:
        try:
            with open(self._usage_path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def _write_usage(self, value: int) -> None:
        tmp = f"{self._usage_path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(max(0, value)))
        os.replace(tmp, self._usage_path)

    def _reserve(self, size: int, rel: str) -> None:
        """Counts `size` bytes in before the copy starts, evicting first when the bound needs
        it, so that concurrent copies cannot each see room for themselves alone."""
        if self.limit is None:
            return
        with self._locked():
            usage = self._read_usage()
            if usage is None or usage + size > self.limit:
                usage = self._evict(size)
                if usage + size > self.limit and not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"VolumeDataset: the cache {self.directory} holds {usage} bytes of files in use "
                        f"(pinned by the processes reading them), so copying {rel!r} ({size} bytes) goes "
                        f"over cache_limit={self.limit}; raise cache_limit to hold at least the files read "
                        "at once on this node (ranks x DataLoader workers x batch).",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            self._write_usage(usage + size)

    def _release(self, size: int) -> None:
        if self.limit is None:
            return
        with self._locked():
            usage = self._read_usage()
            if usage is not None:
                self._write_usage(usage - size)

    def _scan(self) -> Tuple[int, List[Tuple[int, int, str]]]:
        """Bytes held (copies plus copies in progress) and the copies as (atime, size, path)."""
        entries: List[Tuple[int, int, str]] = []
        total = 0
        stack = [self.files_dir]
        while stack:
            try:
                it = os.scandir(stack.pop())
            except FileNotFoundError:
                continue
            with it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            entries.append((st.st_atime_ns, st.st_size, entry.path))
                            total += st.st_size
                    except FileNotFoundError:
                        continue
        now = time.time()
        try:
            tmps = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            tmps = []
        for entry in tmps:
            try:
                reserved = int(entry.name.split(".", 1)[0])
            except ValueError:
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if now - os.fstat(fd).st_mtime > _ORPHAN_AGE_S:
                    os.unlink(entry.path)  # left by a killed process
                    continue
            except BlockingIOError:
                pass  # being written
            except FileNotFoundError:
                continue
            finally:
                os.close(fd)
            total += reserved
        return total, entries

    def _evict(self, needed: int) -> int:
        """Removes least-recently-used copies that nobody holds until `needed` more bytes fit
        with some room to spare; returns the bytes left. Called with the lock held."""
        assert self.limit is not None
        total, entries = self._scan()
        if total + needed <= self.limit:
            return total  # the estimate was high (a crashed copy, a lost race): nothing to do
        target = self.limit - needed - int(self.limit * _LOW_WATER)
        entries.sort()
        for _atime, size, path in entries:
            if total <= target:
                break
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                total -= size
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # pinned: some iterator is handing it out right now
            try:
                os.unlink(path)
                total -= size
            except FileNotFoundError:
                total -= size
            finally:
                os.close(fd)
        return total

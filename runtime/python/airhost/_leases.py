"""GPU leases: concurrent runs on one node never get the same GPU.

Each GPU is an flock()ed file in a per-user directory. The lock lives as long as the
process that took it, so a run that crashes, or a notebook kernel that dies, frees its
GPUs without any clean-up step.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import concurrent.futures
import threading
import time
from typing import Callable, List, Optional


def _lock_dir() -> str:
    d = os.environ.get("AIRHOST_LOCK_DIR") or os.path.join(tempfile.gettempdir(), f"airhost-gpus-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


class GpuLease:
    """Holds `count` GPUs out of `candidates` (keys: NVML index → uuid) until released."""

    def __init__(self, indices: List[int], files: List[int]):
        self.indices = indices
        self._fds = files

    def release(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)  # closing drops the flock
            except OSError:
                pass
        self._fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _try_take(candidates: List[tuple], count: int) -> Optional[GpuLease]:
    taken, fds = [], []
    for index, uuid in candidates:
        path = os.path.join(_lock_dir(), (uuid or f"index-{index}") + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        taken.append(index)
        fds.append(fd)
        if len(taken) == count:
            return GpuLease(taken, fds)
    for fd in fds:
        os.close(fd)
    return None


def acquire(
    candidates: List[tuple],
    count: int,
    wait: Optional[float],
    on_wait: Callable[[str], None] = lambda msg: None,
    cancelled: Optional[threading.Event] = None,
) -> GpuLease:
    """Leases `count` of `candidates` ([(index, uuid)]). `wait`: seconds to wait for GPUs held
    by other runs (None = as long as it takes, 0 = fail at once). `cancelled`, once set, ends
    the wait at once with concurrent.futures.CancelledError (a submitted run's cancel())."""
    deadline = None if wait is None else time.monotonic() + wait
    told = False
    while True:
        if cancelled is not None and cancelled.is_set():
            raise concurrent.futures.CancelledError("cancelled while waiting for GPUs; no rank was started")
        lease = _try_take(candidates, count)
        if lease:
            return lease
        if deadline is not None and time.monotonic() >= deadline:
            raise RuntimeError(
                f"{count} GPU(s) asked for, but other airhost runs on this node hold the rest of its "
                f"{len(candidates)}; wait for them to finish, ask for fewer, or pass "
                "wait_for_accelerators=None to queue until they are free"
            )
        if not told:
            on_wait(f"airhost: waiting for {count} free GPU(s); other runs on this node hold them")
            told = True
        if cancelled is not None:
            cancelled.wait(0.5)
        else:
            time.sleep(0.5)

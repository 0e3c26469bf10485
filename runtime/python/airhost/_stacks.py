"""Every rank's Python stacks of a live run, asked of its host (`airhost stacks`).

The host listens on <run_dir>/host.sock (host/launch/stacks_service.hpp): one request line,
the answer to EOF. The answer is the data of `airhost stacks --json`: "groups" (ranks whose
main threads stand in the same place, the odd ones out first, each with "ranks", "ranges" and
"where") and "ranks" (each rank's node, pid, "where" and every thread's frames, innermost
first), and "file", the full stacks the host wrote into the run directory.
"""
from __future__ import annotations

import json
import os
import socket

SOCKET_NAME = "host.sock"


def ask(run_dir: str, timeout: float = 30.0, sample: float | None = None) -> dict:
    """The stacks of the run whose directory is `run_dir`, from its host; with `sample`
    (seconds), the profile of that long a sampling (`airhost stacks --sample`). Raises
    ConnectionError when no host answers there (the run has ended, or not begun), ValueError
    for a sampling it refuses (one is under way)."""
    request = b"stacks json\n"
    if sample is not None:
        ms = int(round(sample * 1000))
        if not 100 <= ms <= 3600 * 1000:
            raise ValueError(f"sample={sample!r}: sample for 0.1 s to 1 h")
        request = f"stacks json sample={ms}\n".encode()
        timeout += sample
    path = os.path.join(run_dir, SOCKET_NAME)
    dir_fd = -1
    if len(os.fsencode(path)) >= 108:  # longer than sun_path: through the directory's descriptor
        try:
            dir_fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:  # the host has not made it yet (or the run is gone)
            raise ConnectionError(f"no airhost host answers in {run_dir} (no such directory)") from None
        path = f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect(path)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise ConnectionError(f"no airhost host answers in {run_dir} ({e.strerror})") from None
            s.sendall(request)
            chunks = []
            while data := s.recv(1 << 16):
                chunks.append(data)
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
    answer = b"".join(chunks)
    if sample is not None and answer.startswith(b"error: "):
        raise ValueError(answer.decode(errors="replace")[7:].strip())
    if not answer or answer.startswith(b"error: "):
        raise ConnectionError(f"the host in {run_dir} gave no stacks: {answer.decode(errors='replace').strip()}")
    return json.loads(answer)

"""A rank's return value as the caller receives it.

Up to 64 KiB it comes as bytes (a pickle, from the control channel's `result` frame). A larger
one comes as a `_native.ResultMapping`: the rank pickled it (protocol 5, the storage of tensors
and arrays out of band) into shared memory or an unnamed file, the host received the
descriptor, and the native module mapped it copy-on-write. The layout is airhost::ResultBlob's
(include/airhost/report.hpp). Unpickling with buffers that are slices of the mapping builds
NumPy arrays and torch tensors right on it: nothing is copied, and the mapping lives as long
as the objects built on it.
"""
from __future__ import annotations

import pickle
import struct

_HEADER = struct.Struct("<8s7Q")
_MAGIC = b"AHRESULT"


def loads(result):
    """The value of one rank's result: bytes or a mapped result."""
    if isinstance(result, (bytes, bytearray)):
        return pickle.loads(result)
    view = memoryview(result)
    try:
        magic, version, total, stream_offset, stream_length, table, count, _ = _HEADER.unpack_from(view, 0)
        if magic != _MAGIC or version != 1 or total != len(view):
            raise ValueError("not an airhost result (the host checked it: this is a bug)")
        spans = struct.unpack_from(f"<{2 * count}Q", view, table)
        buffers = [view[spans[2 * i] : spans[2 * i] + spans[2 * i + 1]] for i in range(count)]
        return pickle.loads(view[stream_offset : stream_offset + stream_length], buffers=buffers)
    finally:
        view.release()  # the buffers' slices keep the mapping alive where the value uses them

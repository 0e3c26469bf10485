"""airhost.data: files in, checkpoints out.

    VolumeDataset(path)       an IterableDataset over the files under a directory or fsspec
                              URL, partitioned across ranks and DataLoader workers
    VolumeWriter(path)        torch.distributed.checkpoint storage: staged, then published
    VolumeReader(path)
    latest_checkpoint(root)   the newest complete checkpoint under root, or None

Importing airhost alone never imports torch; this module does, on first use of a name.
"""
from __future__ import annotations

import importlib

_NAMES = {
    "VolumeDataset": "._dataset",
    "VolumeWriter": "._checkpoint",
    "VolumeReader": "._checkpoint",
    "latest_checkpoint": "._checkpoint",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'airhost.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__

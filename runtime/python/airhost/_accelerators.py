"""Accelerator types (the names databricks.air uses) and what this node has."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import List, Optional

from . import _native

CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "accelerators.toml")

# Used only if the packaged table cannot be read; configs/accelerators.toml is the truth.
_FALLBACK = [
    {"name": "GPU_1xA10", "gpu": "A10", "count": 1},
    {"name": "GPU_1xH100", "gpu": "H100", "count": 1},
    {"name": "GPU_8xH100", "gpu": "H100", "count": 8},
    {"name": "GPU_8xB300", "gpu": "B300", "count": 8},
]


def _load_table():
    try:
        return _native.load_accelerator_types(os.environ.get("AIRHOST_ACCELERATORS_TOML", CONFIG_PATH))
    except (ValueError, OSError):
        return _FALLBACK


_TABLE = {t["name"]: t for t in _load_table()}


class _AcceleratorTypeBase(str, enum.Enum):
    @property
    def gpu(self) -> str:
        """The GPU model, e.g. "H100"."""
        return _TABLE[self.value]["gpu"]

    @property
    def count(self) -> int:
        """GPUs of that model the type stands for."""
        return _TABLE[self.value]["count"]

    def __str__(self) -> str:
        return self.value


#: Accelerator types by their databricks.air names: ``AcceleratorType.GPU_8xH100``.
AcceleratorType = _AcceleratorTypeBase("AcceleratorType", [(n, n) for n in _TABLE])
AcceleratorType.__doc__ = "Accelerator types by their databricks.air names (configs/accelerators.toml)."

#: Legacy (serverless_gpu) GPU model names: ``GPUType.H100``.
GPUType = enum.Enum("GPUType", [(g, g) for g in dict.fromkeys(t["gpu"] for t in _TABLE.values())], type=str)
GPUType.__doc__ = "GPU models by their legacy serverless_gpu names (deprecated: use AcceleratorType)."


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total: int
    model: Optional[str]  # short model ("H100") when the table knows it


@dataclass
class NodeAccelerators:
    gpus: List[Gpu]
    driver_version: str
    problem: str  # why no GPU is usable, when none is

    @property
    def model(self) -> Optional[str]:
        models = {g.model for g in self.gpus}
        return models.pop() if len(models) == 1 else None

    def describe(self) -> str:
        if not self.gpus:
            return "no GPU" + (f" ({self.problem})" if self.problem else "")
        names = {}
        for g in self.gpus:
            names[g.name] = names.get(g.name, 0) + 1
        return ", ".join(f"{n} × {name}" for name, n in names.items())


def detect() -> NodeAccelerators:
    """The GPUs this process may use (NVML loaded at run time, CUDA_VISIBLE_DEVICES honoured)."""
    inv = _native.detect_accelerators()
    gpus = []
    models = {}  # one table lookup (a TOML parse) per distinct device name, not per GPU
    for g in inv["gpus"]:
        if g["name"] not in models:
            models[g["name"]] = _native.gpu_model_of(CONFIG_PATH, g["name"]) if os.path.exists(CONFIG_PATH) else None
        model = models[g["name"]]
        gpus.append(Gpu(g["index"], g["name"], g["uuid"], g["memory_total"], model))
    return NodeAccelerators(gpus, inv["driver_version"], inv["nvml_error"])


def parse_accelerator_type(value) -> AcceleratorType:
    if isinstance(value, AcceleratorType):
        return value
    if isinstance(value, str):
        for member in AcceleratorType:
            if member.value.lower() == value.lower():
                return member
    known = ", ".join(m.value for m in AcceleratorType)
    raise ValueError(f"unknown accelerator_type {value!r}; use one of: {known}")


def parse_gpu_type(value) -> str:
    """A legacy gpu_type ("H100" or GPUType.H100) → the model name."""
    if isinstance(value, GPUType):
        return value.value
    if isinstance(value, str):
        for member in GPUType:
            if member.value.lower() == value.lower():
                return member.value
    known = ", ".join(m.value for m in GPUType)
    raise ValueError(f"unknown gpu_type {value!r}; use one of: {known}")

"""depthlens: does this residual design turn extra layers into extra computation?

Public API (heavy imports happen on first use, so `depthlens --help` stays instant):

    ModelConfig, DepthModel, build_model   the backbone with ten residual designs
    load, save                             safetensors + JSON checkpoints
    DESIGNS, SLUGS                         the design registry
"""

from __future__ import annotations

from typing import Any

from .designs import DESIGNS, SLUGS

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": ("depthlens.models.config", "ModelConfig"),
    "DepthModel": ("depthlens.models.model", "DepthModel"),
    "build_model": ("depthlens.models.model", "build_model"),
    "load": ("depthlens.io.checkpoint", "load"),
    "save": ("depthlens.io.checkpoint", "save"),
    "Checkpoint": ("depthlens.io.checkpoint", "Checkpoint"),
}

__all__ = ["DESIGNS", "SLUGS", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'depthlens' has no attribute {name!r}")

"""depthlens: does this residual design turn extra layers into extra computation?

Public API (heavy imports happen on first use, so `depthlens --help` stays instant):

    ModelConfig, DepthModel, build_model   the backbone with ten residual designs
    load, save                             depthlens' own safetensors + JSON checkpoints
    open                                   any model by path (depthlens dir, HF dir, GGUF file) through the one
                                           loader -> Opened(model, meta, tokenizer, provenance)
    DESIGNS, SLUGS                         the design registry
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .designs import DESIGNS, SLUGS

_LAZY = {
    "ModelConfig": ("depthlens.models.config", "ModelConfig"),
    "DepthModel": ("depthlens.models.model", "DepthModel"),
    "build_model": ("depthlens.models.model", "build_model"),
    "Checkpoint": ("depthlens.io.checkpoint", "Checkpoint"),
    "open": ("depthlens.adapters.load", "open_model"),
}

__all__ = ["DESIGNS", "SLUGS", "__version__", "load", "save", *_LAZY]


# `load` and `save` are real functions, not lazy attributes: nnsight mounts a `.save` method on every
# Python object once imported, which would shadow a module-level __getattr__ lookup of `depthlens.save`.
def load(path: Any, **kwargs: Any) -> Any:
    """Load and validate a checkpoint directory (see depthlens.io.checkpoint.load)."""
    from .io.checkpoint import load as _load

    return _load(path, **kwargs)


def save(model: Any, path: Any, **kwargs: Any) -> Any:
    """Save a model as a checkpoint directory, atomically (see depthlens.io.checkpoint.save)."""
    from .io.checkpoint import save as _save

    return _save(model, path, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'depthlens' has no attribute {name!r}")

"""Models: config, shared backbone, residual designs, the hooked DepthModel.

The names below load on first use: `depthlens.models.config` and `depthlens.models.layout` are pure Python, so
reading a checkpoint's config or its tensor layout (`depthlens info`) does not import torch through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ModelConfig, even_block_starts, kimi_block_starts
    from .model import Block, DepthModel, build_model

__all__ = ["ModelConfig", "DepthModel", "Block", "build_model", "kimi_block_starts", "even_block_starts"]

_WHERE = {
    "ModelConfig": "config",
    "kimi_block_starts": "config",
    "even_block_starts": "config",
    "DepthModel": "model",
    "Block": "model",
    "build_model": "model",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

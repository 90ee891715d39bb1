"""Residual designs: one small module per family behind the `Design`/`Router` contract (base.py)."""

from __future__ import annotations

from ..config import ModelConfig
from .base import Design
from .single import KEEL, LNS, DeepNorm, PreLN, Sandwich

_DESIGNS: dict[str, type[Design]] = {cls.slug: cls for cls in (PreLN, LNS, Sandwich, DeepNorm, KEEL)}


def register(cls: type[Design]) -> type[Design]:
    """Class decorator used by the multi-stream and cross-layer families."""
    _DESIGNS[cls.slug] = cls
    return cls


def design_for(cfg: ModelConfig) -> Design:
    _load_optional_families()
    if cfg.arch not in _DESIGNS:
        raise ValueError(f"design {cfg.arch!r} is not implemented in this build")
    return _DESIGNS[cfg.arch](cfg)


def _load_optional_families() -> None:
    # Importing a family module registers it; families live in their own small modules.
    import importlib

    for mod in ("hc", "mhc", "attnres", "moda"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise

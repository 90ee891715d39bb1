"""Residual designs: one small module per family behind the `Design`/`Router` contract (base.py).

`_DESIGNS` lists every family explicitly: the family modules register nothing by being imported.
"""

from __future__ import annotations

from ..config import ModelConfig
from .attnres import BlockAttnRes, FullAttnRes
from .base import Design
from .hc import HC
from .mhc import MHC
from .moda import MoDA
from .single import KEEL, LNS, DeepNorm, PreLN, Sandwich

_DESIGNS: dict[str, type[Design]] = {
    cls.slug: cls for cls in (PreLN, LNS, Sandwich, DeepNorm, KEEL, HC, MHC, FullAttnRes, BlockAttnRes, MoDA)
}


def design_for(cfg: ModelConfig) -> Design:
    if cfg.arch not in _DESIGNS:
        raise ValueError(f"design {cfg.arch!r} is not implemented in this build")
    return _DESIGNS[cfg.arch](cfg)

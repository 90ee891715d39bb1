"""Small shared test helpers (imported by test modules; pytest puts tests/ on sys.path)."""

from __future__ import annotations

from typing import Any

from depthlens.models.config import ModelConfig
from depthlens.models.model import build_model


def debug_model(arch: str = "preln", n_layer: int = 4, seed: int = 0, **kw: Any):
    """A tiny CPU model of design `arch` in eval mode (torchtitan's "debugmodel")."""
    return build_model(ModelConfig.debug(arch, n_layer=n_layer, **kw), seed=seed).eval()

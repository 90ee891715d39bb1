"""depthlens: does this residual design turn extra layers into extra computation?

Public API (heavy imports happen on first use, so `depthlens --help` stays instant):

    ModelConfig, DepthModel, build_model   the backbone with ten residual designs
    load, save                             depthlens' own safetensors + JSON checkpoints
    open                                   any model by path (depthlens dir, HF dir, GGUF file) through the one
                                           loader -> Opened(model, meta, tokenizer, provenance)
    wrap, Description                      your own PyTorch model, described by its embed, blocks and head
                                           (docs/own-model.md)
    DESIGNS, SLUGS                         the design registry
    causal, permute, angular, rank,        the diagnostics as functions, the CLI's options and defaults
    attnres, depth_mixing, layer_skip_loss, (`import depthlens as dl; dl.causal("checkpoints/hc_l16")`:
    run, compare, report                   depthlens.studies.api)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .designs import DESIGNS, SLUGS

_LAZY = {
    "ModelConfig": ("depthlens.models.config", "ModelConfig"),
    "DepthModel": ("depthlens.models.model", "DepthModel"),
    "build_model": ("depthlens.models.model", "build_model"),
    "Checkpoint": ("depthlens.io.checkpoint", "Checkpoint"),
    "open": ("depthlens.adapters.load", "open_model"),
    "wrap": ("depthlens.adapters.described", "wrap"),
    "Description": ("depthlens.adapters.described", "Description"),
}
# the Python API (depthlens.studies.api), one name per CLI command
_API = (
    "angular",
    "attnres",
    "causal",
    "compare",
    "depth_mixing",
    "effective_rank",
    "layer_skip_loss",
    "permutation",
    "permute",
    "rank",
    "report",
    "run",
)
_LAZY.update({name: ("depthlens.studies.api", name) for name in _API})

__all__ = [  # written out (not built from _LAZY) so that type checkers and IDEs see every public name
    "DESIGNS",
    "SLUGS",
    "Checkpoint",
    "DepthModel",
    "Description",
    "ModelConfig",
    "__version__",
    "angular",
    "attnres",
    "build_model",
    "causal",
    "compare",
    "depth_mixing",
    "effective_rank",
    "layer_skip_loss",
    "load",
    "open",
    "permutation",
    "permute",
    "rank",
    "report",
    "run",
    "save",
    "wrap",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs (nothing is imported at run time)
    from ._version import __version__
    from .adapters.described import Description, wrap
    from .adapters.load import open_model as open  # noqa: A004
    from .io.checkpoint import Checkpoint
    from .models.config import ModelConfig
    from .models.model import DepthModel, build_model
    from .studies.api import (
        angular,
        attnres,
        causal,
        compare,
        depth_mixing,
        effective_rank,
        layer_skip_loss,
        permutation,
        permute,
        rank,
        report,
        run,
    )


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
    if name == "__version__":  # read from the installed metadata on first use (depthlens._version)
        from ._version import __version__

        return __version__
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'depthlens' has no attribute {name!r}")

"""The depth-mixing matrix M[i → j] of any design (docs/concepts.md): how much of each earlier source reaches each
sublayer's input; MoDA, which has no residual mix, shows its depth-attention mass instead.

    engine.py   the token-mean matrix (or depth mass)
    figure.py   one checkpoint's heatmap

This file is the spec the registry reads (light: its loaders import the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..spec import Diagnostic, Hooks

if TYPE_CHECKING:
    from ..spec import Engine


def _engine() -> Engine:
    from .engine import depth_mixing_dataset

    return depth_mixing_dataset


def _hooks() -> Hooks:
    from .figure import fig_mixing

    return Hooks(figure=fig_mixing)


SPECS = (
    Diagnostic(
        "mixing",
        _engine,
        "depth-mixing matrix M[i → j] (any design)",
        hooks=_hooks,
        aliases=("depth_mixing",),
        title="Depth-mixing matrix M[i → j]",
        untrained=False,
    ),
)

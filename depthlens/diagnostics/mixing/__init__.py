"""The depth-mixing matrix M[i → j] of any design (docs/concepts.md): how much of each earlier source reaches each
sublayer's input; MoDA, which has no residual mix, shows its depth-attention mass instead.

    engine.py   the token-mean matrix (or depth mass)
    figure.py   one checkpoint's heatmap
"""

from __future__ import annotations

from ..spec import Diagnostic, Hooks


def _load() -> Hooks:
    from .engine import depth_mixing_dataset
    from .figure import fig_mixing

    return Hooks(depth_mixing_dataset, figure=fig_mixing)


MIXING_SPEC = Diagnostic(
    "mixing",
    summary="depth-mixing matrix M[i → j] (any design)",
    aliases=("depth_mixing",),
    title="Depth-mixing matrix M[i → j]",
    untrained=False,
    load=_load,
)
SPECS = (MIXING_SPEC,)

"""AttnRes depth attention (docs/concepts.md): the self-weight per layer and the dead prefix k*(ε) of Full and
Block AttnRes.

    engine.py   the depth-softmax weights, k*(ε), the report record, the track series, the terminal view
    figure.py   one checkpoint's self-weights and α
"""

from __future__ import annotations

from ..scores import TrackPanel
from ..spec import Column, Diagnostic, Hooks, Option
from .headline import DEAD_PREFIX_EPS


def _load() -> Hooks:
    from .engine import attnres_dataset, attnres_record, attnres_track, attnres_view
    from .figure import fig_attnres

    return Hooks(attnres_dataset, figure=fig_attnres, record=attnres_record, track=attnres_track, view=attnres_view)


ATTNRES_SPEC = Diagnostic(
    "attnres",
    summary="AttnRes depth-attention weights: self-weight per layer, dead prefix k*(ε), embedding weight",
    requires="depth_softmax",
    needs=("readouts",),
    options=(Option("eps", float, DEAD_PREFIX_EPS, "Dead-prefix threshold ε on the self-weight.", 0.0, 1.0),),
    title="AttnRes self-weight and α",
    record_fields=("dead_prefix",),
    untrained_fields=("dead_prefix",),
    columns=(Column(f"k*({DEAD_PREFIX_EPS:g})", "k*", "dead_prefix"),),
    track_panels=(TrackPanel("dead_prefix", "AttnRes dead prefix\nk*({eps:g}) [layers]"),),
    load=_load,
)
SPECS = (ATTNRES_SPEC,)

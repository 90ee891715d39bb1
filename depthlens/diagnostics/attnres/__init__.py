"""AttnRes depth attention (docs/concepts.md): the self-weight per layer and the dead prefix k*(ε) of Full and
Block AttnRes.

    engine.py   the depth-softmax weights, k*(ε), the report record, the track series, the terminal view
    figure.py   one checkpoint's self-weights and α

This file is the spec the registry reads (light: each hook imports its module when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import TrackPanel
from ..spec import Column, Diagnostic, Option
from .headline import DEAD_PREFIX_EPS

if TYPE_CHECKING:
    from ..spec import Engine, Figure, Record, Track, View


def _engine() -> Engine:
    from .engine import attnres_dataset

    return attnres_dataset


def _figure() -> Figure:
    from .figure import fig_attnres

    return fig_attnres


def _record() -> Record:
    from .engine import attnres_record

    return attnres_record


def _track() -> Track:
    from .engine import attnres_track

    return attnres_track


def _view() -> View:
    from .engine import attnres_view

    return attnres_view


SPECS = (
    Diagnostic(
        "attnres",
        _engine,
        "AttnRes depth-attention weights: self-weight per layer, dead prefix k*(ε), embedding weight",
        requires="depth_softmax",
        needs=("readouts",),
        options=(Option("eps", float, DEAD_PREFIX_EPS, "Dead-prefix threshold ε on the self-weight.", 0.0, 1.0),),
        view=_view,
        figure=_figure,
        title="AttnRes self-weight and α",
        record=_record,
        record_fields=("dead_prefix",),
        untrained_fields=("dead_prefix",),
        columns=(Column(f"k*({DEAD_PREFIX_EPS:g})", "k*", "dead_prefix"),),
        track=_track,
        track_panels=(TrackPanel("dead_prefix", "AttnRes dead prefix\nk*({eps:g}) [layers]"),),
    ),
)

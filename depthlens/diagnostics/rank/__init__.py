"""The effective rank of HC/mHC residual-mixing products, with their Amax gains (docs/concepts.md).

    engine.py   the products per token, erank and gains, the report record, the track series, the terminal view
    figure.py   one checkpoint's window profile

This file is the spec the registry reads (light: each hook imports its module when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import TrackPanel, frozen
from ..spec import Column, Diagnostic

if TYPE_CHECKING:
    from ..spec import Engine, Figure, Record, Track, View


def _engine() -> Engine:
    from .engine import effective_rank_dataset

    return effective_rank_dataset


def _figure() -> Figure:
    from .figure import fig_rank

    return fig_rank


def _record() -> Record:
    from .engine import rank_record

    return rank_record


def _track() -> Track:
    from .engine import rank_track

    return rank_track


def _view() -> View:
    from .engine import rank_view

    return rank_view


SPECS = (
    Diagnostic(
        "rank",
        _engine,
        "effective rank of HC/mHC residual-mixing products, with Amax gains (per token, then averaged)",
        aliases=("erank", "effective_rank"),
        requires="multistream",
        needs=("readouts",),
        figure=_figure,
        title="Effective rank (window profile)",
        record=_record,
        record_fields=("erank_full", "erank_late", "n_streams"),
        untrained_fields=("erank_full",),
        columns=(Column("erank (full)", "erank", "erank_full", ".2f"),),
        track=_track,
        track_name="erank",
        track_panels=(TrackPanel("erank", "effective rank of the\nfull mixing product", frozen(product="full")),),
        view=_view,
    ),
)

"""The effective rank of HC/mHC residual-mixing products, with their Amax gains (docs/concepts.md).

    engine.py   the products per token, erank and gains, the report record, the track series, the terminal view
    figure.py   one checkpoint's window profile

This file is the spec the registry reads (light: its loaders import the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import TrackPanel, frozen
from ..spec import Column, Diagnostic, Hooks

if TYPE_CHECKING:
    from ..spec import Engine


def _engine() -> Engine:
    from .engine import effective_rank_dataset

    return effective_rank_dataset


def _hooks() -> Hooks:
    from .engine import rank_record, rank_track, rank_view
    from .figure import fig_rank

    return Hooks(figure=fig_rank, record=rank_record, track=rank_track, view=rank_view)


SPECS = (
    Diagnostic(
        "rank",
        _engine,
        "effective rank of HC/mHC residual-mixing products, with Amax gains (per token, then averaged)",
        hooks=_hooks,
        aliases=("erank", "effective_rank"),
        requires="multistream",
        needs=("readouts",),
        title="Effective rank (window profile)",
        record_fields=("erank_full", "erank_late", "n_streams"),
        untrained_fields=("erank_full",),
        columns=(Column("erank (full)", "erank", "erank_full", ".2f"),),
        track_name="erank",
        track_panels=(TrackPanel("erank", "effective rank of the\nfull mixing product", frozen(product="full")),),
    ),
)

"""The effective rank of HC/mHC residual-mixing products, with their Amax gains (docs/concepts.md).

engine.py   the products per token, erank and gains, the report record, the track series, the terminal view
figure.py   one checkpoint's window profile
"""

from __future__ import annotations

from ..scores import TrackColumn, TrackPanel, frozen
from ..spec import Column, Diagnostic, Hooks


def _load() -> Hooks:
    from .engine import effective_rank_dataset, rank_record, rank_track, rank_view
    from .figure import fig_rank

    return Hooks(effective_rank_dataset, figure=fig_rank, record=rank_record, track=rank_track, view=rank_view)


RANK_SPEC = Diagnostic(
    "rank",
    summary="effective rank of HC/mHC residual-mixing products, with Amax gains (per token, then averaged)",
    aliases=("erank", "effective_rank"),
    requires="multistream",
    needs=("readouts",),
    title="Effective rank (window profile)",
    record_fields=("erank_full", "erank_late", "n_streams"),
    untrained_fields=("erank_full",),
    columns=(Column("erank (full)", "erank", "erank_full", ".2f"),),
    track_name="erank",
    track_panels=(TrackPanel("erank", "effective rank of the\nfull mixing product", frozen(product="full")),),
    track_columns=(TrackColumn("erank", "erank", "erank of the mixing products"),),  # each product, "—" if none
    load=_load,
)
SPECS = (RANK_SPEC,)

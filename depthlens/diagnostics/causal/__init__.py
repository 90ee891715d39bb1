"""The causal score C(s, t): skip layer s, how much do the later layers' updates change (docs/concepts.md).

    engine.py   the skip arms and the score matrices (`causal_scores`)
    arms.py     which positions each arm skips, and the per-cell store
    dataset.py  the Dataset, its per-sequence parts, the report record and the track series
    figure.py   one checkpoint's heatmap
    headline.py its scores: default θ, θ grid, units, labels, how figures show the matrix

This file is the spec the registry reads (light: its loaders import the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import frozen
from ..spec import Diagnostic, Hooks
from .headline import CAUSAL, DIRECT

if TYPE_CHECKING:
    from ..spec import Engine


def _engine() -> Engine:
    from .engine import causal_scores

    return causal_scores


def _hooks() -> Hooks:
    from .dataset import causal_record, causal_track, regrow
    from .figure import fig_causal

    return Hooks(figure=fig_causal, record=causal_record, track=causal_track, regrow=regrow)


SPECS = (
    Diagnostic(
        "causal",
        _engine,
        "causal score C(s, t): skip layer s, how much do later updates change",
        hooks=_hooks,
        scores=(CAUSAL, DIRECT),
        title="Causal score C(s, t) (current, max)",
        record_fields=("causal_noise_floor",),
        report_opts=frozen(variants=("current",), layers="all"),
        late_opts=frozen(layers="late"),
        study_opts=frozen(layers="causal_layers"),
        regrown=("causal_score", "mean_downstream_effect"),
        part_start="first_seq",
        clean_loss_var="clean_loss_seq",
    ),
)

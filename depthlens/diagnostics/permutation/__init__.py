"""The permutation score P(i, j): swap layers i and j, how much does the LM loss rise (docs/concepts.md).

    engine.py   the swapped forwards, P_abs / P_rel / P_KL, the report record and the track series
    figure.py   one checkpoint's heatmap of the late window
    headline.py its scores: default θ, θ grid, units, labels, how figures show the matrix

This file is the spec the registry reads (light: its loaders import the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import frozen
from ..spec import Diagnostic, Hooks
from .headline import PERM_ABS, PERM_KL, PERM_REL

if TYPE_CHECKING:
    from ..spec import Engine


def _engine() -> Engine:
    from .engine import permutation_scores

    return permutation_scores


def _hooks() -> Hooks:
    from .engine import permutation_record, permutation_track, regrow
    from .figure import fig_permutation

    return Hooks(figure=fig_permutation, record=permutation_record, track=permutation_track, regrow=regrow)


SPECS = (
    Diagnostic(
        "permutation",
        _engine,
        "permutation score P(i, j): swap layers i and j, how much does the loss rise",
        hooks=_hooks,
        aliases=("permute", "perm"),
        prefix="perm",
        scores=(PERM_ABS, PERM_REL, PERM_KL),
        title="Permutation score P_abs (late pairs)",
        report_opts=frozen(swap="body", pairs="late"),
        late_opts=frozen(pairs="late"),
        study_opts=frozen(pairs="perm_pairs"),
        seq_caps=("perm_n_seq", "untrained_perm_n_seq"),
        untrained_where_claimed=True,
        regrown=("perm_abs", "perm_rel", "perm_kl", "perm_abs_se", "clean_loss"),
    ),
)

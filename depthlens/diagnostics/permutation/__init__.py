"""The permutation score P(i, j): swap layers i and j, how much does the LM loss rise (docs/concepts.md).

    engine.py   the swapped forwards, P_abs / P_rel / P_KL, the report record and the track series
    figure.py   one checkpoint's heatmap of the late window

This file is the spec the registry reads (light: each hook imports its module when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import frozen
from ..spec import Diagnostic
from .headline import PERM_ABS, PERM_KL, PERM_REL

if TYPE_CHECKING:
    from ..spec import Engine, Figure, Record, Regrow, Track


def _engine() -> Engine:
    from .engine import permutation_scores

    return permutation_scores


def _figure() -> Figure:
    from .figure import fig_permutation

    return fig_permutation


def _record() -> Record:
    from .engine import permutation_record

    return permutation_record


def _track() -> Track:
    from .engine import permutation_track

    return permutation_track


def _regrow() -> Regrow:
    from .engine import regrow

    return regrow


SPECS = (
    Diagnostic(
        "permutation",
        _engine,
        "permutation score P(i, j): swap layers i and j, how much does the loss rise",
        aliases=("permute", "perm"),
        prefix="perm",
        scores=(PERM_ABS, PERM_REL, PERM_KL),
        figure=_figure,
        title="Permutation score P_abs (late pairs)",
        record=_record,
        track=_track,
        report_opts=frozen(swap="body", pairs="late"),
        late_opts=frozen(pairs="late"),
        study_opts=frozen(pairs="perm_pairs"),
        seq_caps=("perm_n_seq", "untrained_perm_n_seq"),
        untrained_where_claimed=True,
        regrow=_regrow,
        regrown=("perm_abs", "perm_rel", "perm_kl", "perm_abs_se", "clean_loss"),
    ),
)

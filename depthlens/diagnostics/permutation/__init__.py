"""The permutation score P(i, j): swap layers i and j, how much does the LM loss rise (docs/concepts.md).

engine.py   the swapped forwards, P_abs / P_rel / P_KL, the report record and the track series
figure.py   one checkpoint's heatmap of the late window
headline.py its scores: default θ, θ grid, units, labels, how figures show the matrix
command.py  what `depthlens permute` asks of the engine, and what it prints
"""

from __future__ import annotations

from ..scores import frozen
from ..spec import Command, Diagnostic, Hooks, Option, Renamed
from .headline import PERM_ABS, PERM_KL, PERM_REL

SCORES = (PERM_ABS, PERM_REL, PERM_KL)


def _load() -> Hooks:
    from . import command
    from .engine import permutation_record, permutation_scores, permutation_track, regrow
    from .figure import fig_permutation

    return Hooks(
        permutation_scores,
        figure=fig_permutation,
        record=permutation_record,
        track=permutation_track,
        regrow=regrow,
        command=command,
    )


PERMUTATION_SPEC = Diagnostic(
    "permutation",
    summary="permutation score P(i, j): swap layers i and j, how much does the loss rise",
    aliases=("permute", "perm"),
    prefix="perm",
    scores=SCORES,
    title="Permutation score P_abs (late pairs)",
    options=(
        Option(
            "metric",
            str,
            PERM_ABS.key,
            "The score (a Dataset variable): perm_abs (nats) | perm_rel | perm_kl (nats)",
            choices=tuple(s.key for s in SCORES),
        ),
        Option("swap", str, "body", "body (routing stays) | all", choices=("body", "all")),
        Option(
            "layers",
            str,
            "late",
            "Swapped pairs: late (both layers in the late window) | all (every pair)",
            choices=("late", "all"),
        ),
    ),
    command=Command(
        "permute",
        "Permutation score P(i, j): swap layers i and j, how much does the LM loss rise.",
        "Headline threshold θ (nats for abs).",
        "layer pairs",
        "rows: swapped layer i, columns: swapped layer j",
        renamed=(Renamed("pairs", "layers"), Renamed("norm", "metric", prefix="perm_")),
    ),
    report_opts=frozen(swap="body", pairs="late"),
    late_opts=frozen(pairs="late"),
    study_opts=frozen(pairs="perm_pairs"),
    seq_caps=("perm_n_seq", "untrained_perm_n_seq"),
    untrained_where_claimed=True,
    regrown=("perm_abs", "perm_rel", "perm_kl", "perm_abs_se", "clean_loss"),
    load=_load,
)
SPECS = (PERMUTATION_SPEC,)

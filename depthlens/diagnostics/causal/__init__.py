"""The causal score C(s, t): skip layer s, how much do the later layers' updates change (docs/concepts.md).

engine.py   the skip arms and the score matrices (`causal_scores`)
arms.py     which positions each arm skips, and the per-cell store
dataset.py  the Dataset, its per-sequence parts, the report record and the track series
figure.py   one checkpoint's heatmap
headline.py its scores: default θ, θ grid, units, labels, how figures show the matrix
command.py  what `depthlens causal` asks of the engine, and what it prints
"""

from __future__ import annotations

from ..scores import frozen
from ..spec import Command, Diagnostic, Hooks, Option, Renamed
from .headline import CAUSAL, DIRECT


def _load() -> Hooks:
    from . import command
    from .dataset import causal_record, causal_track, regrow
    from .engine import causal_scores
    from .figure import fig_causal

    return Hooks(
        causal_scores, figure=fig_causal, record=causal_record, track=causal_track, regrow=regrow, command=command
    )


CAUSAL_SPEC = Diagnostic(
    "causal",
    summary="causal score C(s, t): skip layer s, how much do later updates change",
    scores=(CAUSAL, DIRECT),
    title="Causal score C(s, t) (current, max)",
    options=(
        Option("variant", str, "current", "current | future", choices=("current", "future")),
        Option(
            "aggregator",
            str,
            CAUSAL.select["aggregator"],
            "Over tokens (the Dataset's aggregator dimension): max | mean | p95 | p99 | pooled",
            choices=("max", "mean", "p95", "p99", "pooled"),
        ),
        Option("unit", str, "block", "block | attn | mlp", choices=("block", "attn", "mlp")),
        Option(
            "norm",
            str,
            "update",
            "Ratio denominator: update (|u_t|, Csordás) | resid (|h_t|, the residual stream entering t)",
            choices=("update", "resid"),
        ),
        Option("layers", str, "all", "Skipped layers: all | late", choices=("all", "late")),
        Option("direct", bool, False, "Also compute the direct-effect companion C_dir."),
        Option(
            "outputs",
            bool,
            False,
            "Also compute the output effect O[s] and the layer-skip loss ΔL_skip(s) (one LM-head pass per "
            "skipped layer).",
        ),
    ),
    command=Command(
        "causal",
        "Causal score C(s, t): skip layer s, how much do later layers' updates change (Csordás et al. 2025).",
        "Headline threshold θ (share of late pairs with C > θ).",
        "layer skips",
        "rows: skipped layer s, columns: later layer t",
        renamed=(Renamed("agg", "aggregator"),),
        plot_symbol="C(s, t)",
        view_max=1.0,  # C = 1: the later update changes by its own size
    ),
    record_fields=("causal_noise_floor",),
    report_opts=frozen(variants=("current",), layers="all"),
    late_opts=frozen(layers="late"),
    study_opts=frozen(layers="causal_layers"),
    regrown=("causal_score", "mean_downstream_effect"),
    part_start="first_seq",
    clean_loss_var="clean_loss_seq",
    load=_load,
)
SPECS = (CAUSAL_SPEC,)

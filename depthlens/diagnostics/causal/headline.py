"""What the causal score headlines: C and C_dir, their default θ, θ grid, units and labels, and how figures
show the matrix (imported by the spec and the figure; its hooks import `dataset` when called)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..scores import Grid, MatrixView, Score, frozen

if TYPE_CHECKING:
    from collections.abc import Callable


def _per_sequence() -> Callable[..., Any]:
    from .dataset import causal_per_sequence

    return causal_per_sequence


def _describe() -> Callable[..., str]:
    from .dataset import describe_headline

    return describe_headline


def _headline_fields() -> Callable[..., dict[str, Any]]:
    from .dataset import headline_fields

    return headline_fields


CAUSAL = Score(
    "causal",
    "causal_score",
    0.45,
    "1",
    "C",
    Grid("linear", 0.0, 1.5, step=0.05),
    "the causal score",
    "causal C(s,t): skip s, relative change of the later update t",
    select=frozen(aggregator="max", variant="current"),
    per_sequence=_per_sequence,
    describe=_describe,
    headline_fields=_headline_fields,
    view=MatrixView(
        "causal score (skipped s → measured t)",
        ("s", "t"),
        upper_only=True,
        colour="span",
        bar_label="causal score C(s,t), current/max [1]",
    ),
)
DIRECT = Score(
    "direct",
    "direct_score",
    CAUSAL.theta,
    "1",
    "C_dir",
    CAUSAL.grid,
    "the direct causal score",
    "direct C_dir(s,t)",
    select=CAUSAL.select,
    bootstraps=False,
    optional=True,
    describe=_describe,
    headline_fields=_headline_fields,
)

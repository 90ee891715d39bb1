"""What the permutation score headlines: P_abs, P_rel and P_KL, their default θ, θ grid, units and labels
(imported by the spec and the figure; its hooks import `engine` when called)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..scores import LOG_NAT, Grid, MatrixView, Score

if TYPE_CHECKING:
    from collections.abc import Callable


def _describe() -> Callable[..., str]:
    from .engine import describe_headline

    return describe_headline


def _headline_fields() -> Callable[..., dict[str, Any]]:
    from .engine import headline_fields

    return headline_fields


def _rel_per_sequence() -> Callable[..., Any]:
    from .engine import perm_rel_per_sequence

    return perm_rel_per_sequence


PERM_ABS = Score(
    "perm_abs",
    "perm_abs",
    0.15,
    "nat",
    "P_abs",
    LOG_NAT,
    "P_abs",
    "permutation P_abs = L(swap i,j) - L(id), nats",
    seq_var="delta_loss_seq",
    describe=_describe,
    headline_fields=_headline_fields,
    view=MatrixView("permutation P_abs (i, j)", bar_label="swap loss increase P_abs [nat]"),
)
PERM_REL = Score(
    "perm_rel",
    "perm_rel",
    PERM_ABS.theta,
    "1",
    "P_rel",
    Grid("log", 0.005, 1.0, n=41),
    "P_rel",
    "permutation P_rel = P_abs / L(id)",
    per_sequence=_rel_per_sequence,
    describe=_describe,
    headline_fields=_headline_fields,
)
PERM_KL = Score(
    "perm_kl",
    "perm_kl",
    PERM_ABS.theta,
    "nat",
    "P_KL",
    LOG_NAT,
    "P_KL",
    "permutation P_KL = mean KL(p_id || p_swap), nats",
    seq_var="kl_seq",
    describe=_describe,
    headline_fields=_headline_fields,
)

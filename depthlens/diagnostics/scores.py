"""What a headline score is: what a share is taken of, its default θ and grid, unit, labels, how figures show its
matrix. Each diagnostic package declares its own scores with these (`causal.CAUSAL`, `permutation.PERM_ABS`);
`registry` re-exports the types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Grid:
    """A default θ grid: "linear" (start..stop inclusive, step) or "log" (`n` log-spaced points start..stop)."""

    kind: str  # "linear" | "log"
    start: float
    stop: float
    step: float = 0.0  # linear only
    n: int = 0  # log only


@dataclass(frozen=True)
class MatrixView:
    """How a figure shows a score's (layer, layer_other) matrix: the overview grid of `depthlens report` reads this,
    not the diagnostic's name."""

    title: str = ""  # the matrix in the figure's title (default: "<label> (i, j)")
    axes: tuple[str, str] = ("i", "j")  # what rows and columns index
    upper_only: bool = False  # entries below the diagonal are undefined (causal: t < s) and drawn blank
    # "diverging": around 0, symmetric, vlag (a loss change of either sign);
    # "span": viridis over the data's range, log beyond 1.5 (plotting.panels.causal_scale: ratios above 1 are common)
    colour: str = "diverging"
    bar_label: str = ""  # the colour bar's label (default: "<label> [<unit>]")


@dataclass(frozen=True)
class TrackPanel:
    """A row of `depthlens track`'s figure for a tracked series other than a headline share (those get a row each
    by themselves): the variable, its y label (format fields: the run's attrs, e.g. {eps}), and the coordinates to
    pick where the variable has them (the first value where the one named is absent)."""

    var: str
    label: str
    select: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TrackColumn:
    """A column of `depthlens track`'s table for a tracked series other than a headline share (those get theirs by
    themselves): the variable at a run's first and last snapshot, each value of its other dimension ("/"-joined,
    in coordinate order; "—" where neither snapshot has a finite one). Its header is `label` in a terminal, and
    `what` with the dimension's values in the report."""

    var: str
    label: str  # the short header ("erank")
    what: str  # the report's header, before the dimension's values ("erank of the mixing products")
    fmt: str = ".2f"  # each value's format


@dataclass(frozen=True)
class Score:
    """One headline score: S(θ) = share of late pairs (i, j) whose score matrix entry is > θ."""

    key: str  # name in sweep/compare `--metric(s)` and in `sweep.headline(ds, key)`
    var: str  # dataset variable holding the (…, layer, layer_other) matrix
    theta: float  # the default headline θ (typed nowhere else)
    unit: str  # CF unit of the score, hence of θ ("1" or "nat")
    symbol: str  # how tables and titles name it ("C", "P_abs")
    grid: Grid  # the default θ grid of sweeps and the report's share curves
    label: str  # what the score is, for axis labels and titles ("causal score (current, max)")
    definition: str  # one line stating what a share of it measures (headlines, tables)
    select: Mapping[str, str] = field(default_factory=dict)  # coords picked on `var` for the headline matrix
    seq_var: str | None = None  # (layer, layer_other, sequence) variable whose sequence mean is `var`: its CI
    # loader of (ds, aggregator, variant) -> stats.shares.PerSequence | None (None: not decomposable, e.g. p95), for a
    # score that is not the plain sequence mean of `seq_var`; DepthlensError when ds lacks the parts
    per_sequence: Callable[[], Callable[..., Any]] | str | None = None
    bootstraps: bool = True  # per-sequence summaries exist, so the share gets a bootstrap CI and shard sd
    optional: bool = False  # only computed when asked (causal --direct): not offered by compare/sweep
    view: MatrixView = MatrixView()  # how figures show the matrix
    # loader of (score, *, variant, aggregator, norm, swap) -> str: the headline's one-line definition with
    # the settings it was computed under (`sweep.definition`); None: `definition` as it stands
    describe: Callable[[], Callable[..., str]] | str | None = None
    # loader of (ds, metric, variant) -> dict: the headline's score-specific fields, "norm" first (e.g. a
    # noise floor, the clean loss); None: {"norm": key}
    headline_fields: Callable[[], Callable[..., dict[str, Any]]] | str | None = None

    @property
    def theta_label(self) -> str:
        """Axis label of θ: 'threshold θ on the causal score [1]'."""
        return f"threshold θ on {self.label} [{self.unit}]"


def frozen(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(kw)


LOG_NAT = Grid("log", 0.005, 2.0, n=41)  # the θ grid of a score in nats (the permutation's)

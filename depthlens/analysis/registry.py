"""The diagnostic registry: one declaration per diagnostic, read by the CLI, the Python API, compare, sweep
and report.

    d = registry.get("permute")                 # aliases resolve: permute / perm → permutation
    ds = registry.run("permutation", model, data, pairs="late", checkpoint=ckpt)   # the one dispatch path
    registry.score("perm_abs").theta            # 0.15: the default thresholds are typed only here

A `Diagnostic` names its engine and figure as "module:function" strings, imported on first use, so this
module imports nothing heavy at its top and `depthlens --help` can read names, aliases and thresholds
instantly. Which designs a diagnostic applies to is a design capability flag (`depthlens.designs`), never a
slug test. Adding a diagnostic = one engine module + one entry in `DIAGNOSTICS` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from depthlens.designs import has_capability
from depthlens.errors import DepthlensError


@dataclass(frozen=True)
class Score:
    """One headline score: S(θ) = share of late pairs (i, j) whose score matrix entry is > θ."""

    key: str  # name in sweep/compare `--metric(s)` and in `sweep.headline(ds, key)`
    var: str  # dataset variable holding the (…, layer, layer_other) matrix
    theta: float  # the default headline θ (typed nowhere else)
    unit: str  # CF unit of the score, hence of θ ("1" or "nat")
    symbol: str  # how tables and titles name it ("C", "P_abs")
    bootstraps: bool = True  # per-sequence summaries exist, so the share gets a bootstrap CI and shard sd
    optional: bool = False  # only computed when asked (causal --direct): not offered by compare/sweep


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic: what to call, on which designs, what it headlines and how the report draws it."""

    name: str  # canonical name: report `--metrics`, netCDF file names, figure keys
    engine: str  # "module:function" with signature fn(model, data: EvalData, *, checkpoint, batch_size, **opts)
    summary: str  # one line for help texts
    aliases: tuple[str, ...] = ()  # other names accepted wherever `name` is (CLI command, record prefix)
    requires: str | None = None  # design capability flag (depthlens.designs.CAPABILITIES); None = every design
    scores: tuple[Score, ...] = ()  # headline scores, the first is the report's table column
    figure: str | None = None  # "module:function" drawing one checkpoint's Dataset for the report
    prefix: str = ""  # of its report summary.json columns (`<prefix>_share`, ...); "" = the name
    report_opts: Mapping[str, Any] = field(default_factory=dict)  # engine options of report, compare and sweep
    late_opts: Mapping[str, Any] = field(default_factory=dict)  # ...restricted to what the headline needs

    def __post_init__(self) -> None:
        if not self.prefix:
            object.__setattr__(self, "prefix", self.name)

    @property
    def bootstraps(self) -> bool:
        return any(s.bootstraps for s in self.scores)

    @property
    def headline(self) -> Score | None:
        """The score the report's table and sweep figures use (None: no share headline)."""
        return self.scores[0] if self.scores else None

    def applies(self, design: str) -> bool:
        """Whether this diagnostic is defined for design slug `design`."""
        return self.requires is None or has_capability(design, self.requires)


def _frozen(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(kw)


CAUSAL = Score("causal", "causal_score", 0.45, "1", "C")
PERM_ABS = Score("perm_abs", "perm_abs", 0.15, "nat", "P_abs")

DIAGNOSTICS: tuple[Diagnostic, ...] = (
    Diagnostic("causal", "depthlens.analysis.causal:causal_scores",
               "causal score C(s, t): skip layer s, how much do later updates change",
               scores=(CAUSAL, Score("direct", "direct_score", CAUSAL.theta, "1", "C_dir", bootstraps=False,
                                     optional=True)),
               figure="depthlens.report.figures:fig_causal",
               report_opts=_frozen(variants=("current",)), late_opts=_frozen(layers="late")),
    Diagnostic("permutation", "depthlens.analysis.permutation:permutation_scores",
               "permutation score P(i, j): swap layers i and j, how much does the loss rise",
               aliases=("permute", "perm"), prefix="perm",
               scores=(PERM_ABS, Score("perm_rel", "perm_rel", PERM_ABS.theta, "1", "P_rel"),
                       Score("perm_kl", "perm_kl", PERM_ABS.theta, "nat", "P_KL")),
               figure="depthlens.report.figures:fig_permutation",
               report_opts=_frozen(swap="body"), late_opts=_frozen(pairs="late")),
    Diagnostic("angular", "depthlens.analysis.angular:angular_distances",
               "angular distance d(h_l, h_l+n) between residual states",
               figure="depthlens.report.figures:fig_angular", report_opts=_frozen(positions="all")),
    Diagnostic("mixing", "depthlens.analysis.attnres:depth_mixing_dataset",
               "depth-mixing matrix M[i → j] (any design)", aliases=("depth_mixing",),
               figure="depthlens.report.figures:fig_mixing"),
    Diagnostic("rank", "depthlens.analysis.rank:effective_rank_dataset",
               "effective rank of residual-mixing products", aliases=("erank", "effective_rank"),
               requires="multistream", figure="depthlens.report.figures:fig_rank"),
    Diagnostic("attnres", "depthlens.analysis.attnres:attnres_dataset",
               "AttnRes self-weight, dead prefix k*(ε), consumption", requires="depth_softmax",
               figure="depthlens.report.figures:fig_attnres"),
)

NAMES: tuple[str, ...] = tuple(d.name for d in DIAGNOSTICS)
_BY_NAME = {n: d for d in DIAGNOSTICS for n in (d.name, *d.aliases)}
ALIASES: tuple[str, ...] = tuple(_BY_NAME)  # every accepted diagnostic name
_SCORES = {s.key: (d, s) for d in DIAGNOSTICS for s in d.scores}
SCORE_KEYS: tuple[str, ...] = tuple(_SCORES)  # every headline score
SWEEPABLE: tuple[str, ...] = tuple(k for k, (_, s) in _SCORES.items() if not s.optional)  # compare/sweep choices
THRESHOLDS: Mapping[str, float] = MappingProxyType({k: s.theta for k, (_, s) in _SCORES.items()})


# --dtype names of every analysis command (CLI, report, track), to torch dtype attribute names. bf16 changes the
# forward only: the engines reduce (norms, sums of squares, softmax/NLL, angles, SVDs) in float32/float64.
DTYPES: Mapping[str, str] = MappingProxyType({"fp32": "float32", "float32": "float32", "bf16": "bfloat16",
                                              "bfloat16": "bfloat16", "fp64": "float64", "float64": "float64"})


def load_dtype(name: str) -> Any:
    """The torch dtype to load weights in for --dtype `name`, None for float32 (the loaders' default);
    DepthlensError for an unknown name."""
    if name not in DTYPES:
        raise DepthlensError(f"--dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    import torch

    dt = getattr(torch, DTYPES[name])
    return None if dt == torch.float32 else dt


def get(name: str) -> Diagnostic:
    """The diagnostic called `name` (or an alias); DepthlensError listing the names otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise DepthlensError(f"unknown diagnostic {name!r}; choose from {', '.join(NAMES)}") from None


def score(key: str) -> Score:
    """The headline score `key` ("causal", "perm_abs", ...)."""
    return score_owner(key)[1]


def score_owner(key: str) -> tuple[Diagnostic, Score]:
    """(the diagnostic that computes score `key`, the score)."""
    try:
        return _SCORES[key]
    except KeyError:
        raise DepthlensError(f"unknown metric {key!r}; choose from {sorted(_SCORES)}") from None


def resolve(ref: str) -> Callable[..., Any]:
    """Import a "module:function" reference."""
    mod, _, fn = ref.partition(":")
    return getattr(importlib.import_module(mod), fn)


def run(name: str, model: Any, data: Any, **opts: Any) -> Any:
    """Run diagnostic `name` (or an alias) on `model` over `data`: the one dispatch path of CLI, API and report.

    `opts` go to the engine as they are (checkpoint, batch_size and the engine's own options).
    """
    return resolve(get(name).engine)(model, data, **opts)

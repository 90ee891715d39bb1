"""The diagnostic registry: one declaration per diagnostic, read by the CLI, the Python API, compare, sweep
and report.

    d = registry.get("permute")                 # aliases resolve: permute / perm → permutation
    registry.diagnostics()                      # every diagnostic, shipped and `register`ed, in table order
    ds = registry.run("permutation", model, data, pairs="late", checkpoint=ckpt)   # the one dispatch path
    registry.score("perm_abs").theta            # 0.15: the default thresholds are typed only here

A `Diagnostic` names its engine and figure as "module:function" strings, imported on first use, so this
module imports nothing heavy at its top and `depthlens --help` can read names, aliases and thresholds
instantly. Which designs a diagnostic applies to is a design capability flag (`depthlens.designs`), never a
slug test; what it needs from a model is a model capability (`models.protocol.capabilities`), so native, Hugging
Face and GGUF models are treated alike. Adding a diagnostic = one module + one entry in `DIAGNOSTICS` (or a
`register` call): docs/architecture.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from depthlens.designs import has_capability
from depthlens.errors import DepthlensError

from .scores import CAUSAL as CAUSAL
from .scores import DEAD_PREFIX_EPS as DEAD_PREFIX_EPS
from .scores import LOG_NAT, frozen
from .scores import PERM_ABS as PERM_ABS
from .scores import Grid as Grid
from .scores import MatrixView as MatrixView
from .scores import Score as Score
from .scores import TrackPanel as TrackPanel

if TYPE_CHECKING:  # typing only: this module imports nothing heavy at run time
    import xarray as xr

    from depthlens.models.protocol import LayeredLM
    from depthlens.runtime.evaldata import EvalData


@dataclass(frozen=True)
class Column:
    """A report table column that is not a share: `field` of the diagnostic's record, formatted with `fmt`."""

    head: str  # the table heading ("erank (full)")
    short: str  # the terminal table heading ("erank")
    field: str  # the record field it shows
    fmt: str = ""  # format spec ("" = str)


@dataclass(frozen=True)
class Option:
    """A typed engine option of a diagnostic: `--name` of its generated command, and the engine keyword `name`.
    A number must be finite and within [lo, hi] (bounds None = open); the command refuses anything else in one
    line."""

    name: str  # the engine keyword (the flag is --name with "_" -> "-")
    type: type  # float | int | str | bool
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()  # a str option's values ("" = any)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> Any:
        """Its value type for a command's signature: a Literal of the choices, else the type."""
        return Literal[self.choices] if self.choices else self.type

    def check(self, value: Any) -> str | None:
        """Why `value` is refused (one line), or None."""
        if self.choices and value not in self.choices:
            return f"{self.flag} must be one of {', '.join(self.choices)}; got {value!r}"
        if self.type not in (int, float):
            return None
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        v = float(value)
        if (
            v != v
            or v in (float("inf"), float("-inf"))
            or (self.lo is not None and v < self.lo)
            or (self.hi is not None and v > self.hi)
        ):
            return f"{self.flag} must be a finite number in [{lo}, {hi}], got {value}"
        return None


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic and everything the commands need to know about it: what to call, on which models, what it
    headlines, and how a report row, the report's figures, the terminal and `track` summarise its Dataset.

    Every hook is a "module:function" string, imported on first use:
      engine(model, data: EvalData, *, checkpoint, batch_size, **opts) -> xr.Dataset
      record(ds, n_layer) -> {field: JSON value}: the report row's own fields (besides the share columns)
      track(ds, opts) -> {name: DataArray}: the per-snapshot variables `track` keeps (default: the share)
      view(ds, model) -> (headline dict, text lines, rich renderable or None): the terminal view of its command
      figure(ds, entry[, share=...]) -> matplotlib Figure or None: one checkpoint's figure in the report
    """

    name: str  # canonical name: report `--metrics`, netCDF file names, figure keys
    engine: str  # "module:function" (see above)
    summary: str  # one line for help texts
    aliases: tuple[str, ...] = ()  # other names accepted wherever `name` is (CLI command, record prefix)
    requires: str | None = None  # design capability flag (depthlens.designs.CAPABILITIES); None = every design
    needs: tuple[str, ...] = ("layers",)  # model capabilities (depthlens.models.protocol.CAPABILITIES)
    options: tuple[Option, ...] = ()  # typed engine options: its generated command's flags (--opt takes others)
    scores: tuple[Score, ...] = ()  # headline scores, the first is the report's table column
    figure: str | None = None  # "module:function" drawing one checkpoint's Dataset for the report
    record: str | None = None  # "module:function" giving the report row's own fields
    record_fields: tuple[str, ...] = ()  # ...their names, in summary.json order
    # ...those a report row also carries as read on the untrained twin (`<field>_untrained`)
    untrained_fields: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()  # report table columns besides the share
    track: str | None = None  # "module:function" of its `track` variables; None = the headline share (if any)
    track_name: str = ""  # its name in `track` (metric names, cache files); "" = the name
    track_panels: tuple[TrackPanel, ...] = ()  # rows of the track figure for its series other than the share
    view: str | None = None  # "module:function" of its terminal view; None = the generic one
    title: str = ""  # figure caption in the report ("" = the summary)
    prefix: str = ""  # of its report summary.json columns (`<prefix>_share`, ...); "" = the name
    # also run on each checkpoint's untrained twin in a report: the baseline a learned effect is read against
    untrained: bool = True
    report_opts: Mapping[str, Any] = field(default_factory=dict)  # engine options of report, compare and sweep
    late_opts: Mapping[str, Any] = field(default_factory=dict)  # ...restricted to what the headline needs
    # engine option -> the study option (StudyOptions field, a report flag) that sets it: causal's layers,
    # the permutation's pairs
    study_opts: Mapping[str, str] = field(default_factory=dict)
    # the study options (StudyOptions fields) that cap its eval sequences to a prefix, trained and untrained: the
    # permutation's, the main cost of a deep report; () = it always sees every sequence
    seq_caps: tuple[str, str] | tuple[()] = ()
    # under --untrained-perm-for claims, its untrained run happens only where a claim on its scores names the
    # design and depth (stats.orderings.claim_cells(prefix)): the permutation, as costly untrained as trained
    untrained_where_claimed: bool = False
    # --precision (studies/precision.py): "module:function" (ds, parts) -> [aggregates it could not rebuild]
    # re-derives the whole-run aggregates (`regrown`) of a Dataset concatenated from runs on consecutive slices of
    # the eval set; None = the diagnostic cannot grow its eval set
    regrow: str | None = None
    regrown: tuple[str, ...] = ()  # ...the variables it re-derives
    part_start: str | None = None  # engine option taking a part's first sequence index (causal: its cuts continue)

    def __post_init__(self) -> None:
        for attr, default in (("prefix", self.name), ("track_name", self.name), ("title", self.summary)):
            if not getattr(self, attr):
                object.__setattr__(self, attr, default)

    @property
    def bootstraps(self) -> bool:
        return any(s.bootstraps for s in self.scores)

    @property
    def headline(self) -> Score | None:
        """The score the report's table and sweep figures use (None: no share headline)."""
        return self.scores[0] if self.scores else None

    @property
    def tracked(self) -> bool:
        """Whether `track` follows it over training (it declares a track hook or has a headline share)."""
        return self.track is not None or self.headline is not None

    def applies(self, design: str) -> bool:
        """Whether this diagnostic is defined for design slug `design`."""
        return self.requires is None or has_capability(design, self.requires)

    def missing(self, model: Any) -> tuple[str, ...]:
        """The model capabilities it needs that `model` lacks (() = it can run)."""
        from depthlens.models.protocol import capabilities

        have = capabilities(model)
        return tuple(c for c in self.needs if c not in have)


DIAGNOSTICS: tuple[Diagnostic, ...] = (
    Diagnostic(
        "causal",
        "depthlens.diagnostics.causal:causal_scores",
        "causal score C(s, t): skip layer s, how much do later updates change",
        scores=(
            CAUSAL,
            Score(
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
                describe=CAUSAL.describe,
                headline_fields=CAUSAL.headline_fields,
            ),
        ),
        figure="depthlens.diagnostics.figures:fig_causal",
        title="Causal score C(s, t) (current, max)",
        record="depthlens.diagnostics.causal_dataset:causal_record",
        record_fields=("causal_noise_floor",),
        track="depthlens.diagnostics.causal_dataset:causal_track",
        report_opts=frozen(variants=("current",), layers="all"),
        late_opts=frozen(layers="late"),
        study_opts=frozen(layers="causal_layers"),
        regrow="depthlens.diagnostics.causal_dataset:regrow",
        regrown=("causal_score", "mean_downstream_effect"),
        part_start="first_seq",
    ),
    Diagnostic(
        "permutation",
        "depthlens.diagnostics.permutation:permutation_scores",
        "permutation score P(i, j): swap layers i and j, how much does the loss rise",
        aliases=("permute", "perm"),
        prefix="perm",
        scores=(
            PERM_ABS,
            Score(
                "perm_rel",
                "perm_rel",
                PERM_ABS.theta,
                "1",
                "P_rel",
                Grid("log", 0.005, 1.0, n=41),
                "P_rel",
                "permutation P_rel = P_abs / L(id)",
                per_sequence="depthlens.diagnostics.permutation:perm_rel_per_sequence",
                describe=PERM_ABS.describe,
                headline_fields=PERM_ABS.headline_fields,
            ),
            Score(
                "perm_kl",
                "perm_kl",
                PERM_ABS.theta,
                "nat",
                "P_KL",
                LOG_NAT,
                "P_KL",
                "permutation P_KL = mean KL(p_id || p_swap), nats",
                seq_var="kl_seq",
                describe=PERM_ABS.describe,
                headline_fields=PERM_ABS.headline_fields,
            ),
        ),
        figure="depthlens.diagnostics.figures:fig_permutation",
        title="Permutation score P_abs (late pairs)",
        record="depthlens.diagnostics.permutation:permutation_record",
        track="depthlens.diagnostics.permutation:permutation_track",
        report_opts=frozen(swap="body", pairs="late"),
        late_opts=frozen(pairs="late"),
        study_opts=frozen(pairs="perm_pairs"),
        seq_caps=("perm_n_seq", "untrained_perm_n_seq"),
        untrained_where_claimed=True,
        regrow="depthlens.diagnostics.permutation:regrow",
        regrown=("perm_abs", "perm_rel", "perm_kl", "perm_abs_se", "clean_loss"),
    ),
    Diagnostic(
        "rank",
        "depthlens.diagnostics.rank:effective_rank_dataset",
        "effective rank of HC/mHC residual-mixing products, with Amax gains (per token, then averaged)",
        aliases=("erank", "effective_rank"),
        requires="multistream",
        needs=("readouts",),
        figure="depthlens.diagnostics.figures:fig_rank",
        title="Effective rank (window profile)",
        record="depthlens.diagnostics.rank:rank_record",
        record_fields=("erank_full", "erank_late", "n_streams"),
        untrained_fields=("erank_full",),
        columns=(Column("erank (full)", "erank", "erank_full", ".2f"),),
        track="depthlens.diagnostics.rank:rank_track",
        track_name="erank",
        track_panels=(TrackPanel("erank", "effective rank of the\nfull mixing product", frozen(product="full")),),
        view="depthlens.diagnostics.rank:rank_view",
    ),
    Diagnostic(
        "attnres",
        "depthlens.diagnostics.attnres:attnres_dataset",
        "AttnRes depth-attention weights: self-weight per layer, dead prefix k*(ε), embedding weight",
        requires="depth_softmax",
        needs=("readouts",),
        options=(Option("eps", float, DEAD_PREFIX_EPS, "Dead-prefix threshold ε on the self-weight.", 0.0, 1.0),),
        view="depthlens.diagnostics.attnres:attnres_view",
        figure="depthlens.diagnostics.figures:fig_attnres",
        title="AttnRes self-weight and α",
        record="depthlens.diagnostics.attnres:attnres_record",
        record_fields=("dead_prefix",),
        untrained_fields=("dead_prefix",),
        columns=(Column(f"k*({DEAD_PREFIX_EPS:g})", "k*", "dead_prefix"),),
        track="depthlens.diagnostics.attnres:attnres_track",
        track_panels=(TrackPanel("dead_prefix", "AttnRes dead prefix\nk*({eps:g}) [layers]"),),
    ),
    Diagnostic(
        "angular",
        "depthlens.diagnostics.angular:angular_distances",
        "angular distance D_n(l) between residual states (Gromov et al. 2024)",
        options=(
            Option("positions", str, "last", "last | all (BOS excluded)", choices=("last", "all")),
            Option(
                "repr", str, "view", "view | flatten (HC/mHC) | input (AttnRes)", choices=("view", "flatten", "input")
            ),
        ),
        view="depthlens.diagnostics.angular:angular_view",
        figure="depthlens.diagnostics.figures:fig_angular",
        title="Angular distance d(h_ℓ, h_ℓ+n)",
        record="depthlens.diagnostics.angular:angular_record",
        record_fields=("angular_d1_mean",),
        track="depthlens.diagnostics.angular:angular_track",
        untrained=False,
        report_opts=frozen(positions="all"),
    ),
    Diagnostic(
        "mixing",
        "depthlens.diagnostics.attnres:depth_mixing_dataset",
        "depth-mixing matrix M[i → j] (any design)",
        aliases=("depth_mixing",),
        figure="depthlens.diagnostics.figures:fig_mixing",
        title="Depth-mixing matrix M[i → j]",
        untrained=False,
    ),
    *(
        Diagnostic(
            f"{kind}_lens",
            f"depthlens.diagnostics.lens:{kind}_lens",
            summary,
            aliases=(f"{kind}lens",),
            figure="depthlens.diagnostics.figures:fig_lens",
            title=f"{kind.capitalize()} lens: KL to the final layer and top-1 agreement by relative depth",
            record=f"depthlens.diagnostics.lens_summary:{kind}_lens_record",
            record_fields=tuple(
                f"{kind}_lens_{k}" for k in ("forms", "forms_low", "forms_high", "kl_mid", "agree_mid", "forms_at")
            ),
            untrained_fields=(f"{kind}_lens_forms",),
            columns=(Column(f"{kind} lens forms at l/L", f"{kind} forms", f"{kind}_lens_forms", ".2f"),),
            view="depthlens.diagnostics.lens_summary:lens_view",
        )
        for kind, summary in (
            ("logit", "logit lens: KL to the final layer, target rank and top-1 agreement at every layer boundary"),
            ("tuned", "tuned lens (trained affine translators): KL to the final layer, target rank, top-1 agreement"),
        )
    ),
)

_EXTRA: list[Diagnostic] = []  # added by `register` (tests, plug-ins), after the shipped ones


def diagnostics() -> tuple[Diagnostic, ...]:
    """Every diagnostic, in table and file order: the shipped ones, then any `register`ed."""
    return DIAGNOSTICS + tuple(_EXTRA)


def names() -> tuple[str, ...]:
    """Canonical names of every diagnostic (report `--metrics`)."""
    return tuple(d.name for d in diagnostics())


def _by_name() -> dict[str, Diagnostic]:
    return {n: d for d in diagnostics() for n in (d.name, *d.aliases)}


def aliases() -> tuple[str, ...]:
    """Every accepted diagnostic name (canonical names and aliases)."""
    return tuple(_by_name())


def _scores() -> dict[str, tuple[Diagnostic, Score]]:
    return {s.key: (d, s) for d in diagnostics() for s in d.scores}


def score_keys() -> tuple[str, ...]:
    """Every headline score."""
    return tuple(_scores())


def sweepable() -> tuple[str, ...]:
    """The scores compare and sweep offer (`--metric(s)`): every score not computed only on request."""
    return tuple(k for k, (_, s) in _scores().items() if not s.optional)


def untrained_names() -> tuple[str, ...]:
    """The diagnostics a report also runs on each untrained twin by default (`Diagnostic.untrained`)."""
    return tuple(d.name for d in diagnostics() if d.untrained)


def thresholds() -> dict[str, float]:
    """score key → its default headline θ."""
    return {k: s.theta for k, (_, s) in _scores().items()}


@contextmanager
def register(*extra: Diagnostic) -> Iterator[tuple[Diagnostic, ...]]:
    """Add diagnostics for the duration of a `with` block (a plug-in, a test), then remove them again.

    A name, alias or score key that is already taken is refused (DepthlensError): one name, one diagnostic."""
    taken = set(aliases()) | set(score_keys())
    for d in extra:
        mine = {d.name, *d.aliases, *(s.key for s in d.scores)}
        if mine & taken:
            raise DepthlensError(f"diagnostic {d.name!r}: {', '.join(sorted(mine & taken))} already registered")
        taken |= mine
    _EXTRA.extend(extra)
    try:
        yield extra
    finally:
        for d in extra:
            _EXTRA.remove(d)


# names of the shipped registry, for help texts and module-level defaults (`diagnostics()` also sees registered ones)
NAMES: tuple[str, ...] = names()
ALIASES: tuple[str, ...] = aliases()
SCORE_KEYS: tuple[str, ...] = score_keys()
SWEEPABLE: tuple[str, ...] = sweepable()
THRESHOLDS: Mapping[str, float] = MappingProxyType(thresholds())
UNTRAINED: tuple[str, ...] = untrained_names()


# --dtype names of every analysis command (CLI, report, track), to torch dtype attribute names. bf16 changes the
# forward only: the engines reduce (norms, sums of squares, softmax/NLL, angles, SVDs) in float32/float64.
DTYPES: Mapping[str, str] = MappingProxyType(
    {
        "fp32": "float32",
        "float32": "float32",
        "bf16": "bfloat16",
        "bfloat16": "bfloat16",
        "fp64": "float64",
        "float64": "float64",
    }
)


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
        return _by_name()[name]
    except KeyError:
        raise DepthlensError(f"unknown diagnostic {name!r}; choose from {', '.join(names())}") from None


def score(key: str) -> Score:
    """The headline score `key` ("causal", "perm_abs", ...)."""
    return score_owner(key)[1]


def by_prefix(prefix: str) -> Diagnostic | None:
    """The diagnostic whose report columns start with `prefix` ("causal", "perm"): how claims name their scores."""
    return next((d for d in DIAGNOSTICS if d.prefix == prefix), None)


def score_owner(key: str) -> tuple[Diagnostic, Score]:
    """(the diagnostic that computes score `key`, the score)."""
    try:
        return _scores()[key]
    except KeyError:
        raise DepthlensError(f"unknown metric {key!r}; choose from {sorted(score_keys())}") from None


def resolve(ref: str) -> Callable[..., Any]:
    """Import a "module:function" reference."""
    mod, _, fn = ref.partition(":")
    return getattr(importlib.import_module(mod), fn)


def run(name: str, model: LayeredLM, data: EvalData, **opts: Any) -> xr.Dataset:
    """Run diagnostic `name` (or an alias) on `model` over `data`: the one dispatch path of CLI, API and report.

    `opts` go to the engine as they are (checkpoint, batch_size and the engine's own options), except `progress`,
    which only an engine that takes it gets (a plug-in engine need not know about progress bars). A model without
    a capability the diagnostic needs is refused with one line (DepthlensError), before any work.
    """
    d = get(name)
    lacking = d.missing(model)
    if lacking:
        raise DepthlensError(
            f"{d.name} needs model capability {', '.join(lacking)}, which this model "
            f"({type(model).__name__}) does not offer"
        )
    engine = resolve(d.engine)
    if "progress" in opts and not _takes(engine, "progress"):
        opts = {k: v for k, v in opts.items() if k != "progress"}
    return engine(model, data, **opts)


def _takes(fn: Any, name: str) -> bool:
    """Whether `fn` accepts keyword `name` (by name or through **kwargs)."""
    import inspect

    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


# record fields whose value on the untrained model (`<field>_untrained`) a report row also carries: the eval loss,
# then each shipped diagnostic's `untrained_fields`
UNTRAINED_RECORD_FIELDS = ("eval_loss", *(f for d in DIAGNOSTICS for f in d.untrained_fields))

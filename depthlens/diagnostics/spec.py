"""What a diagnostic is: the typed spec (`Diagnostic`) each diagnostic package declares in its `__init__.py`, with
its engine options (`Option`), report columns (`Column`) and own command (`Command`), and the call shapes of its
hooks (Protocols).

A spec has one loader, a function of no arguments that imports its modules (torch, xarray) when called and returns
its `Hooks`: the function that computes its Dataset (`Engine`) and the others (figure, report record, track series,
terminal view, regrow, what its own command asks for and prints), each typed by a Protocol below. A package's `__init__.py` is
read by the registry when `depthlens --help` starts, so the spec costs nothing to read, while mypy checks each
function against its Protocol and the import checker sees its modules. A plug-in outside the package tree may
instead name its engine by a "module:function" string (`Diagnostic.loaded` imports it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from depthlens.designs import has_capability

from .scores import Score, TrackColumn, TrackPanel

if TYPE_CHECKING:  # typing only: this module imports nothing heavy at run time
    import xarray as xr

    from depthlens.models.protocol import LayeredLM
    from depthlens.plotting.panels import Entry
    from depthlens.runtime.evaldata import EvalData


class Engine(Protocol):
    """engine(model, data, *, batch_size, checkpoint, <its options>) -> the diagnostic's Dataset (and `progress`,
    a callback (done, total), where it takes one)."""

    def __call__(
        self, model: LayeredLM, data: EvalData, /, *, batch_size: int | None = None, checkpoint: Any = None
    ) -> xr.Dataset: ...


class Record(Protocol):
    """record(ds, row) -> {field: JSON value}: a report row's own fields (besides the share columns)."""

    def __call__(self, ds: xr.Dataset, row: Mapping[str, Any], /) -> dict[str, Any]: ...


class Track(Protocol):
    """track(ds, opts) -> {name: DataArray}: the per-snapshot variables `track` keeps."""

    def __call__(self, ds: xr.Dataset, opts: Any, /) -> dict[str, Any]: ...


class View(Protocol):
    """view(ds, model) -> (headline dict, text lines, rich renderable or None): its command's terminal view."""

    def __call__(self, ds: xr.Dataset, model: Any, /) -> tuple[dict[str, Any], list[str], Any]: ...


class Figure(Protocol):
    """figure(ds, entry[, share=...]) -> a matplotlib Figure, or None: one checkpoint's figure in the report (a
    diagnostic with headline scores also takes `share`, the headline share to print)."""

    def __call__(self, ds: xr.Dataset, entry: Entry, /) -> Any: ...


class ScoredFigure(Protocol):
    """The figure of a diagnostic with headline scores: also takes the headline share to print in its title."""

    def __call__(self, ds: xr.Dataset, entry: Entry, /, share: float | None = None) -> Any: ...


class Regrow(Protocol):
    """regrow(ds, parts) -> [aggregates it could not rebuild]: re-derives the whole-run aggregates of a Dataset
    concatenated from runs on consecutive slices of the eval set (`--precision`)."""

    def __call__(self, ds: xr.Dataset, parts: Sequence[xr.Dataset], /) -> list[str]: ...


class OwnCommand(Protocol):
    """What a diagnostic's own command (`Command`) asks for and prints, besides the headline, the dataset and the
    matrix: two functions (its package's `command` module is one)."""

    def plan(self, opts: Mapping[str, Any], /) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(score key, its coordinates picked for the headline, engine options): what the command's options ask for
        (each typed option by name, old spellings resolved, `threshold` and `window`)."""
        ...

    def lines(
        self, ds: xr.Dataset, h: Mapping[str, Any], opts: Mapping[str, Any], share: str, /
    ) -> tuple[list[str], list[str]]:
        """(its --verbose lines, its lines after them); `share` is the headline share in the CLI's words."""
        ...


@dataclass(frozen=True)
class Hooks:
    """What computes a diagnostic's Dataset (`engine`) and what it does with it, each function typed by its
    Protocol; None = it has none (the report draws no figure, the row has only the share columns, the command
    prints the generic view, `--precision` cannot grow its eval set, `track` follows only the headline share)."""

    engine: Engine  # computes its Dataset
    figure: Figure | ScoredFigure | None = None  # one checkpoint's figure in the report (ScoredFigure: with scores)
    record: Record | None = None  # the report row's own fields (`Diagnostic.record_fields`)
    track: Track | None = None  # its `track` variables, besides the headline share
    view: View | None = None  # the terminal view of its command
    regrow: Regrow | None = None  # --precision: re-derives the whole-run aggregates (`Diagnostic.regrown`)
    command: OwnCommand | None = None  # what its own command asks for and prints (`Diagnostic.command`)


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
        """Its value type for a command's signature: a Literal of the choices, else the type (or None, its default
        None)."""
        kind = Literal[self.choices] if self.choices else self.type
        return kind if self.default is not None else kind | None

    def check(self, value: Any) -> str | None:
        """Why `value` is refused (one line), or None."""
        if value is None and self.default is None:
            return None
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
class Renamed:
    """An option's old spelling, still taken this version with a note on stderr: `--old` (hidden from the help, its
    choices those of `new` less `prefix`) sets option `new` (--norm abs = --metric perm_abs)."""

    old: str  # the old option's keyword (its flag --old)
    new: str  # the option it sets now
    prefix: str = ""  # the new value is this + the old one; the note then names both values


@dataclass(frozen=True)
class Command:
    """A diagnostic's own command, `depthlens <name> CKPT`, reading one of its headline scores on the matrix it
    shows: besides its typed `options` it takes --threshold (θ, default the headline score's), --window,
    --precision, --plot and --verbose, but no --opt (not every option is an engine option). Its hook `Hooks.command`
    says what the options ask for and what it prints besides the headline, the dataset and the matrix."""

    name: str  # the command ("permute")
    help: str  # its help line
    threshold_help: str  # --threshold's help
    doing: str  # what its progress line says it runs, after the checkpoint's name ("layer skips")
    rows: str  # what the rows and columns of its terminal matrix are
    renamed: tuple[Renamed, ...] = ()  # old spellings, noted in this order
    plot_symbol: str = ""  # the score in its --plot figure's title ("" = the score's symbol)
    view_max: float | None = None  # the value of the terminal matrix's top glyph (None = the matrix's maximum)


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic and everything the commands need to know about it: what to call, on which models, what it
    headlines, and how a report row, the report's figures, the terminal and `track` summarise its Dataset.

    Its loader imports its modules when called and returns its `Hooks`: the function computing its Dataset
    (`Engine`) and the others; a plug-in may instead give its engine as a "module:function" string.
    """

    name: str  # canonical name: report `--metrics`, netCDF file names, figure keys
    load: Callable[[], Hooks] | str  # its engine and hooks (a "module:function" string: the engine alone)
    summary: str  # one line for help texts
    aliases: tuple[str, ...] = ()  # other names accepted wherever `name` is (CLI command, record prefix)
    requires: str | None = None  # design capability flag (depthlens.designs.CAPABILITIES); None = every design
    needs: tuple[str, ...] = ("layers",)  # model capabilities (depthlens.models.protocol.CAPABILITIES)
    options: tuple[Option, ...] = ()  # typed engine options: its generated command's flags (--opt takes others)
    scores: tuple[Score, ...] = ()  # headline scores, the first is the report's table column
    command: Command | None = None  # its own command reading a score (None: the generic one, cli/diagnostic.py)
    record_fields: tuple[str, ...] = ()  # the fields `Hooks.record` gives, in summary.json order
    # ...those a report row also carries as read on the untrained twin (`<field>_untrained`)
    untrained_fields: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()  # report table columns besides the share
    track_name: str = ""  # its name in `track` (metric names, cache files); "" = the name
    track_panels: tuple[TrackPanel, ...] = ()  # rows of the track figure for its series other than the share
    track_columns: tuple[TrackColumn, ...] = ()  # columns of the track table for its series other than the share
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
    # --precision (studies/precision.py): the variables `Hooks.regrow` re-derives for a Dataset concatenated from
    # runs on consecutive slices of the eval set
    regrown: tuple[str, ...] = ()
    part_start: str | None = None  # engine option taking a part's first sequence index (causal: its cuts continue)
    # its (sequence,) variable of the unperturbed model's eval loss per sequence, over every eval sequence: the
    # report's depth loss change (L against L/2, paired over the same sequences) reads the first diagnostic in
    # registry order that declares one (`registry.clean_loss`); None = it gives none
    clean_loss_var: str | None = None

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
        return self.headline is not None or self.loaded().track is not None

    def loaded(self) -> Hooks:
        """Its engine and hooks, their modules imported (a "module:function" engine: that engine, no hooks)."""
        if callable(self.load):
            return self.load()
        module, _, function = self.load.partition(":")
        return Hooks(getattr(importlib.import_module(module), function))

    def applies(self, design: str) -> bool:
        """Whether this diagnostic is defined for design slug `design`."""
        return self.requires is None or has_capability(design, self.requires)

    def missing(self, model: Any) -> tuple[str, ...]:
        """The model capabilities it needs that `model` lacks (() = it can run)."""
        from depthlens.models.protocol import capabilities

        have = capabilities(model)
        return tuple(c for c in self.needs if c not in have)

"""The diagnostic registry: one declaration per diagnostic, read by the CLI, the Python API, compare, sweep
and report.

    d = registry.get("permute")                 # aliases resolve: permute / perm → permutation
    registry.diagnostics()                      # every diagnostic, shipped and `register`ed, in table order
    ds = registry.run("permutation", model, data, pairs="late", checkpoint=ckpt)   # the one dispatch path
    registry.score("perm_abs").theta            # its default θ, typed once: in the package's headline.py

Each shipped diagnostic is a package (`PACKAGES`) whose `__init__.py` declares its `Diagnostic` spec: typed
callables that import their module (torch, xarray) only when called, so `depthlens --help` reads names, aliases
and thresholds instantly. Which designs a diagnostic applies to is a design capability flag (`depthlens.designs`), never a
slug test; what it needs from a model is a model capability (`models.protocol.capabilities`), so native, Hugging
Face and GGUF models are treated alike. Adding a diagnostic = one package + its name in `PACKAGES` (or a
`register` call): docs/architecture.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from depthlens.errors import DepthlensError

from .attnres.headline import DEAD_PREFIX_EPS as DEAD_PREFIX_EPS
from .causal.headline import CAUSAL as CAUSAL
from .permutation.headline import PERM_ABS as PERM_ABS
from .scores import Grid as Grid
from .scores import MatrixView as MatrixView
from .scores import Score as Score
from .scores import TrackColumn as TrackColumn
from .scores import TrackPanel as TrackPanel
from .spec import Column as Column
from .spec import Command as Command
from .spec import Diagnostic as Diagnostic
from .spec import Option as Option
from .spec import Renamed as Renamed

if TYPE_CHECKING:  # typing only: this module imports nothing heavy at run time
    import xarray as xr

    from depthlens.models.protocol import LayeredLM
    from depthlens.runtime.evaldata import EvalData


# The shipped diagnostics: one package each under depthlens/diagnostics/, whose `__init__.py` declares its `SPECS`
# (docs/architecture.md). This list is the only place that names them; its order is the report table's.
PACKAGES = ("causal", "permutation", "rank", "attnres", "angular", "mixing", "lens")


def _shipped() -> tuple[Diagnostic, ...]:
    return tuple(d for p in PACKAGES for d in importlib.import_module(f"{__package__}.{p}").SPECS)


DIAGNOSTICS: tuple[Diagnostic, ...] = _shipped()

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


def headline_keys() -> tuple[str, ...]:
    """Each diagnostic's headline score (its first), in registry order: the scores `compare` shows by default; the
    first is the default of `sweep` and `sweep.headline`."""
    return tuple(d.headline.key for d in diagnostics() if d.headline is not None)


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
HEADLINES: tuple[str, ...] = headline_keys()
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


def clean_loss() -> tuple[Diagnostic, str] | None:
    """(the diagnostic, its variable) giving the unperturbed eval loss per sequence (`Diagnostic.clean_loss_var`):
    the first in registry order that declares one; None when none does."""
    return next(((d, d.clean_loss_var) for d in diagnostics() if d.clean_loss_var), None)


def score_owner(key: str) -> tuple[Diagnostic, Score]:
    """(the diagnostic that computes score `key`, the score)."""
    try:
        return _scores()[key]
    except KeyError:
        raise DepthlensError(f"unknown metric {key!r}; choose from {sorted(score_keys())}") from None


def resolve(ref: Callable[[], Callable[..., Any]] | str) -> Callable[..., Any]:
    """A score's hook as the function it names: its loader called, or a plug-in's "module:function" reference
    imported."""
    if callable(ref):
        return ref()
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
    engine = d.loaded().engine
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

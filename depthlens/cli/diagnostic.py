"""The command of every diagnostic, built from its registry entry: `depthlens <name> CKPT`.

A diagnostic whose spec declares its own `Command` (causal, permute) is registered on the app by `cli.analyze`, in
registry order, ahead of the commands over several checkpoints; it reads one headline score: --threshold,
--window, --precision, --plot and --verbose besides its typed options; its hook `Hooks.command` says which score,
coordinates and engine options those ask for, and what it prints besides the headline.

Any other diagnostic gets the generic command: `OneLineErrors.get_command` (cli.app) asks here, through the hooks this
module sets, for any name the registry knows and no module defines, so a registered diagnostic
(`registry.register`, or a new package in `PACKAGES`) is a command with no CLI edit. It runs the engine through the
API with the engine's report options (plus `--opt key=value`), writes the Dataset, and prints the diagnostic's
terminal view (`Hooks.view`) or the generic one: the headline share with its CI, if it has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from ..diagnostics import registry
from ..errors import DepthlensError
from ..io.files import StrictJSONError, strict_json
from ..runtime.defaults import DEFAULT_N_BOOT
from .app import OneLineErrors, QuietOpt, deprecated, domain_errors, fail, rank0_errors
from .common import (
    EVAL_DEFAULTS,
    EVAL_OPTIONS,
    BootOpt,
    CkptArg,
    Common,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    PlotOpt,
    VerboseOpt,
    _fmt_share,
    _matrix_view,
    _opts,
    busy,
    check_plot,
    check_threshold,
    emit,
    eval_data,
    eval_options,
    headline_line,
    open_model,
    resolve_out,
    save_plot,
    write,
)
from .precision import PrecisionOpt
from .precision import line as precision_line
from .precision import run as precision_run

if TYPE_CHECKING:
    import xarray as xr

OptOpt = Annotated[list[str] | None, typer.Option("--opt", help="Engine option key=value (repeated).")]
WindowOpt = Annotated[Literal["quarter", "half", "zero"], typer.Option(help="Late-window start: quarter | half | zero")]
# the parameters only a diagnostic's own command (`Command`) has besides --threshold, and only the generic one
OWN_ONLY = ("window", "precision", "plot", "verbose")
GENERIC_ONLY = ("opt",)


def parse_opts(items: list[str]) -> dict[str, Any]:
    """`--opt key=value` pairs → engine options (values read as JSON where they parse, else as strings)."""
    out: dict[str, Any] = {}
    for it in items:
        key, eq, raw = it.partition("=")
        if not eq or not key.isidentifier():
            fail(f"--opt expects key=value, got {it!r}", 2)
        try:
            out[key] = strict_json(raw)
        except StrictJSONError as e:  # a duplicate key, NaN inside a list, a 5,000-digit integer
            if raw.strip() not in ("NaN", "Infinity", "-Infinity"):
                fail(f"--opt {key}=...: the value {e}", 2)
            out[key] = raw
        except ValueError:
            out[key] = raw
        except RecursionError:
            fail(f"--opt {key}=...: the value is nested too deeply", 2)
    return out


def generic_view(
    d: registry.Diagnostic, ds: Any, model: Any, n_boot: int, seed: int
) -> tuple[dict[str, Any], list[str]]:
    """The headline share (with its CI) of a diagnostic with a score, else the Dataset's variables."""
    head: dict[str, Any] = {
        "metric": d.name,
        "design": getattr(model.design, "slug", "?"),
        "n_layer": int(model.n_layer),
    }
    lines = [f"{d.name}: {d.summary}"]
    if d.headline:
        from ..studies.summaries import headline_of

        h = headline_of(ds, d.headline.key, n_boot=n_boot, seed=seed)
        if h is not None:
            head[d.headline.key] = h
            lines.append(f"share {d.headline.symbol} > {h['threshold']:g}: {_fmt_share(h)}")
    lines.append("variables: " + ", ".join(sorted(str(v) for v in ds.data_vars)))
    return head, lines


def command_name(d: registry.Diagnostic) -> str:
    """The command of diagnostic `d`: its own command's name, else its name."""
    return d.command.name if d.command is not None else d.name


def command_function(d: registry.Diagnostic) -> Any:
    """The function of diagnostic `d`'s command, its signature the command's options (typer builds them from it):
    its own command (`d.command`) or the generic one."""

    def run(
        ckpt: CkptArg,
        opt: OptOpt = None,  # the generic command's
        window: WindowOpt = "quarter",  # ...and the rest of OWN_ONLY: its own command's
        c: Common = EVAL_DEFAULTS,  # the shared eval options (common.eval_options)
        n_boot: BootOpt = DEFAULT_N_BOOT,
        precision: PrecisionOpt = None,
        out: OutOpt = None,
        plot: PlotOpt = None,
        overwrite: OverwriteOpt = False,
        as_json: JsonOpt = False,
        verbose: VerboseOpt = False,
        quiet: QuietOpt = False,
        **typed: Any,  # --threshold (its own command) and the entry's typed options (`_add_options`)
    ) -> None:
        for o in d.options:
            why = o.check(typed[o.name])
            if why:
                fail(why, 2)
        if d.command is None:
            engine_opts = {**d.report_opts, **typed, **parse_opts(opt or [])}
            run_generic(d, ckpt, c, n_boot, out, overwrite, as_json, engine_opts)
        else:
            check_threshold(typed["threshold"])  # before any note on an old spelling
            for r in d.command.renamed:
                renamed(r, typed)
            opts = {**typed, "window": window}
            run_own(d, d.command, ckpt, opts, c, n_boot, precision, out, plot, overwrite, as_json, verbose)

    run.__doc__ = d.summary if d.command is None else d.command.help
    # off: the other kind of command's options, and --n-boot where there is no headline interval to resample
    for name in (*(OWN_ONLY if d.command is None else GENERIC_ONLY), *(() if d.bootstraps else ("n_boot",))):
        _drop_option(run, name)
    _add_options(run, _typed_parameters(d))
    fn = domain_errors(eval_options(run))  # annotations evaluated once, by eval_options
    return fn if d.command is None else rank0_errors(fn)


def command_for(d: registry.Diagnostic) -> Any:
    """A click command running diagnostic `d` on one checkpoint."""
    sub = typer.Typer(add_completion=False)
    sub.command(name=command_name(d))(command_function(d))
    return typer.main.get_command(sub)


def renamed(r: registry.Renamed, typed: dict[str, Any]) -> None:
    """An old spelling given: the option it sets now takes its value, with a note on stderr."""
    old = typed.pop(r.old)
    if old is None:
        return
    if r.prefix:
        deprecated(f"--{r.old} {old}", f"--{r.new} {r.prefix}{old}")
    else:
        deprecated(f"--{r.old}", f"--{r.new}")
    typed[r.new] = r.prefix + old


def run_generic(
    d: registry.Diagnostic,
    ckpt: Path,
    c: Common,
    n_boot: int,
    out: str | None,
    overwrite: bool,
    as_json: bool,
    engine_opts: dict[str, Any],
) -> None:
    """The generic command: the engine with `engine_opts`, the Dataset written, its terminal view printed."""
    path, ow = resolve_out(out, ckpt, d.name, overwrite)
    model, ck = open_model(ckpt, c)
    with busy(f"{d.name} {ckpt.name} (batches)") as p:
        ds = registry.run(
            d.name,
            model,
            eval_data(model, ck, c),
            checkpoint=ck,
            batch_size=c.batch_size,
            progress=p.engine(),
            **engine_opts,
        )
    write(ds, path, ow, f"depthlens {d.name} {ckpt}")
    show = d.loaded().view
    if show:
        head, lines, view = show(ds, model)
    else:
        (head, lines), view = generic_view(d, ds, model, n_boot, c.seed), None
    head = {"metric": head.pop("metric", d.name), "checkpoint": str(ckpt), **head, "out": str(path)}
    emit(
        head,
        as_json,
        [
            f"[bold]{ckpt}[/bold] ({head.get('design', '?')}, L={head.get('n_layer', '?')})",
            *lines,
            f"dataset: {path}",
        ],
        view,
    )


def run_own(
    d: registry.Diagnostic,
    cmd: registry.Command,
    ckpt: Path,
    opts: dict[str, Any],
    c: Common,
    n_boot: int,
    precision: float | None,
    out: str | None,
    plot: Path | None,
    overwrite: bool,
    as_json: bool,
    verbose: bool,
) -> None:
    """Its own command: the score its options ask for (`Hooks.command`) to --precision when given, the headline
    share of its late window above --threshold with its interval (also in the Dataset's attrs), the Dataset written,
    the headline, its own lines and its matrix printed, the matrix drawn at --plot."""
    threshold = opts["threshold"]
    path, ow = resolve_out(out, ckpt, d.name, overwrite)
    check_plot(plot, path, overwrite)
    own = d.loaded().command
    if own is None:  # a programming error in the entry
        raise DepthlensError(f"diagnostic {d.name}: a command of its own needs its hook `command`")
    key, select, engine = own.plan(opts)
    head = {"threshold": threshold, **select, "start": opts["window"], "n_boot": n_boot, "seed": c.seed}
    from ..diagnostics.sweep import headline, interval_attrs, score_matrix

    model, ck = open_model(ckpt, c)
    with busy(f"{cmd.name} {ckpt.name} ({cmd.doing})") as p:
        ds = precision_run(
            d.name,
            model,
            eval_data(model, ck, c),
            precision,
            {"metric": key, **head},
            checkpoint=ck,
            progress=p.engine(),
            **engine,
            **_opts(c),
        )
    h = headline(ds, key, **head)
    ds.attrs.update(interval_attrs(h))
    write(ds, path, ow)
    h.update(checkpoint=str(ckpt), design=getattr(model.design, "slug", "?"), n_layer=int(model.n_layer), out=str(path))
    score = registry.score(key)
    lines = [headline_line(h, score.symbol, f"{ckpt} ({h['design']}, L={h['n_layer']})")]
    verbose_lines, more = own.lines(ds, h, opts, _fmt_share(h))
    lines += [*(verbose_lines if verbose else []), *more, *precision_line(ds), f"dataset: {path}", cmd.rows]
    m = score_matrix(ds, key, select.get("aggregator"), select.get("variant"))
    if score.view.upper_only:  # undefined entries (causal: t < s) are "·", not "no effect"
        from ..plotting.plots import upper_triangle

        m = upper_triangle(m)
    symbol = cmd.plot_symbol or score.symbol
    save_plot(
        plot, lambda: _figure(m, f"{ckpt.name}: {symbol} > {threshold:g} in {100 * h['share']:.1f}% of late pairs")
    )
    h["plot"] = str(plot) if plot else None
    emit(h, as_json, lines, _matrix_view(m, cmd.view_max))


def _figure(da: xr.DataArray, title: str) -> Any:
    """The (layer, layer_other) matrix as a heatmap (axes and colour bar labelled from the Dataset's attrs)."""
    import matplotlib

    matplotlib.use("Agg")
    from ..plotting.plots import heatmap

    return heatmap(da, vmin=0.0, title=title)


def _drop_option(fn: Any, name: str) -> None:
    """Take option `name` off `fn`'s signature (typer builds the options from it): `fn` then runs with its
    default."""
    import inspect

    sig = inspect.signature(fn)
    assert sig.parameters[name].default is not inspect.Parameter.empty, name
    fn.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != name])


def _typed_parameters(d: registry.Diagnostic) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default) of the options `d`'s command takes besides its fixed ones, in their help order:
    --threshold (its own command), then its typed options, each old spelling (hidden) after the option it renames."""
    old = {r.new: r for r in d.command.renamed} if d.command is not None else {}
    out: list[tuple[str, Any, Any]] = []
    if d.command is not None:
        theta = d.headline.theta if d.headline is not None else 0.0
        out.append(("threshold", Annotated[float, typer.Option("--threshold", help=d.command.threshold_help)], theta))
    for o in d.options:
        out.append((o.name, Annotated[o.annotation, typer.Option(o.flag, help=o.help)], o.default))
        if o.name in old:
            r = old[o.name]
            was = registry.Option(r.old, o.type, None, "", choices=tuple(v.removeprefix(r.prefix) for v in o.choices))
            hidden = typer.Option(was.flag, hidden=True, help=f"Deprecated spelling of {o.flag}.")
            out.append((r.old, Annotated[was.annotation, hidden], None))
    return out


def _add_options(fn: Any, options: list[tuple[str, Any, Any]]) -> None:
    """Put `options` (name, annotation, default) on `fn`'s signature after the checkpoint (typer builds flags from
    it); `fn` receives them in its `**typed`."""
    import inspect

    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in params} | {"c", *(name for name, _, _ in EVAL_OPTIONS)}
    clash = [name for name, _, _ in options if name in taken]
    if clash:  # a programming error in the entry, caught when its command is built
        raise DepthlensError(f"options {clash} of a diagnostic clash with the command's own options")
    typed = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)
        for name, annotation, default in options
    ]
    fn.__signature__ = sig.replace(parameters=[params[0], *typed, *params[1:]])


def registry_command(name: str, own: list[str]) -> Any:
    """The generic command `name` of a diagnostic, or None if the registry does not know it or one of its names
    already is a command (`permute` for permutation)."""
    d = next((d for d in registry.diagnostics() if command_name(d) == name), None)
    return command_for(d) if d is not None and not {d.name, *d.aliases} & set(own) else None


def registry_names(own: list[str]) -> list[str]:
    """The commands of the diagnostics with none among `own`."""
    return [command_name(d) for d in registry.diagnostics() if not {d.name, *d.aliases} & set(own)]


OneLineErrors.extra_command = staticmethod(registry_command)
OneLineErrors.extra_names = staticmethod(registry_names)
_ = Path  # the CkptArg annotation's type

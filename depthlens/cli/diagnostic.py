"""The command of a diagnostic that has no dedicated one: `depthlens <name> CKPT`, built from its registry entry.

`OneLineErrors.get_command` (cli.app) asks here, through the hooks this module sets, for any name the registry
knows and no module defines, so a registered diagnostic (`registry.register`, or a new `DIAGNOSTICS` entry) is a
command with no CLI edit. It runs the engine
through the API with the engine's report options (plus `--opt key=value`), writes the Dataset, and prints the
diagnostic's terminal view (`Hooks.view`) or the generic one: the headline share with its CI, if it has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..diagnostics import registry
from ..errors import DepthlensError
from ..io.files import StrictJSONError, strict_json
from .analyze import (
    BootOpt,
    CkptArg,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    _fmt_share,
    busy,
    emit,
    eval_data,
    open_model,
    resolve_out,
    write,
)
from .app import OneLineErrors, QuietOpt, domain_errors, fail
from .common import EVAL_DEFAULTS, EVAL_OPTIONS, Common, eval_options


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


def command_for(d: registry.Diagnostic) -> Any:
    """A click command running diagnostic `d` on one checkpoint."""

    def run(
        ckpt: CkptArg,
        opt: Annotated[list[str] | None, typer.Option("--opt", help="Engine option key=value (repeated).")] = None,
        c: Common = EVAL_DEFAULTS,  # the shared eval options (common.eval_options)
        n_boot: BootOpt = 1000,
        out: OutOpt = None,
        overwrite: OverwriteOpt = False,
        as_json: JsonOpt = False,
        quiet: QuietOpt = False,
        **typed: Any,  # the entry's typed options (`_add_options`)
    ) -> None:
        for o in d.options:
            why = o.check(typed[o.name])
            if why:
                fail(why, 2)
        engine_opts = {**d.report_opts, **typed, **parse_opts(opt or [])}
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

    run.__doc__ = d.summary
    if not d.bootstraps:  # no headline interval to resample: no --n-boot
        _drop_option(run, "n_boot")
    _add_options(run, d.options)
    sub = typer.Typer(add_completion=False)
    sub.command(name=d.name)(domain_errors(eval_options(run)))  # annotations evaluated once, by eval_options
    return typer.main.get_command(sub)


def _drop_option(fn: Any, name: str) -> None:
    """Take option `name` off `fn`'s signature (typer builds the options from it): `fn` then runs with its
    default."""
    import inspect

    sig = inspect.signature(fn)
    assert sig.parameters[name].default is not inspect.Parameter.empty, name
    fn.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != name])


def _add_options(fn: Any, options: tuple[registry.Option, ...]) -> None:
    """Put the entry's typed options on `fn`'s signature after the checkpoint (typer builds flags from it); `fn`
    receives them in its `**typed`."""
    import inspect

    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in params} | {"c", *(name for name, _, _ in EVAL_OPTIONS)}
    clash = [o.name for o in options if o.name in taken]
    if clash:  # a programming error in the entry, caught when its command is built
        raise DepthlensError(f"options {clash} of a diagnostic clash with the command's own options")
    typed = [
        inspect.Parameter(
            o.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=o.default,
            annotation=Annotated[o.annotation, typer.Option(o.flag, help=o.help)],
        )
        for o in options
    ]
    fn.__signature__ = sig.replace(parameters=[params[0], *typed, *params[1:]])


def registry_command(name: str, own: list[str]) -> Any:
    """The generic command of diagnostic `name`, or None if the registry does not know it or one of its names
    already is a dedicated command (`permute` for permutation)."""
    try:
        d = registry.get(name)
    except Exception:  # noqa: BLE001  (not a diagnostic: the group reports the unknown command)
        return None
    return command_for(d) if name == d.name and not {d.name, *d.aliases} & set(own) else None


def registry_names(own: list[str]) -> list[str]:
    """The diagnostics with no dedicated command among `own`."""
    return [d.name for d in registry.diagnostics() if not {d.name, *d.aliases} & set(own)]


OneLineErrors.extra_command = staticmethod(registry_command)
OneLineErrors.extra_names = staticmethod(registry_names)
_ = Path  # the CkptArg annotation's type

"""Typer app and the shared error handling: one clear line on stderr, exit 1 (domain) or 2 (usage)."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click
from typer.core import TyperGroup

from ..io.ownership import SCRATCH_DIR


class OneLineErrors(TyperGroup):
    """Usage errors as one line on stderr (exit 2) instead of a multi-line panel. A diagnostic of the registry
    without a dedicated command gets the generic one (`cli.diagnostic`)."""

    # set by cli.diagnostic (imported by the package): (name, own command names) -> the generic command of a
    # registry diagnostic, and (own names) -> the diagnostics without a dedicated command
    extra_command: Callable[[str, list[str]], Any] | None = None
    extra_names: Callable[[list[str]], list[str]] | None = None

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and OneLineErrors.extra_command is not None:
            cmd = OneLineErrors.extra_command(cmd_name, super().list_commands(ctx))
        return cmd

    def list_commands(self, ctx: Any) -> list[str]:
        own = super().list_commands(ctx)
        return own + (OneLineErrors.extra_names(own) if OneLineErrors.extra_names is not None else [])

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,  # click's default, passed on (the signature of the method overridden)
        **extra: Any,
    ) -> Any:
        sanitise_thread_env()
        try:
            args = _pair_weights(args)
            if sys.stdout is None:  # started with stdout closed (`>&-`): every result printed would be lost silently
                raise _click.exceptions.ClickException(
                    "stdout is closed: nothing could be printed; redirect it to a "
                    "file (or /dev/null) instead of closing it"
                )
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except _click.exceptions.NoArgsIsHelpError as e:
            sys.stdout.write(e.format_message() + "\n")
            rv = 2
        except _click.exceptions.ClickException as e:
            msg = " ".join(e.format_message().split())
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None and ctx.command_path != "depthlens" else ""
            if not _other_rank():  # every rank parses the same argv: rank 0 says it once
                sys.stderr.write(f"depthlens: error: {where}{msg}\n")
            rv = e.exit_code
        except typer.Abort:
            sys.stderr.write("depthlens: aborted\n")
            rv = 1
        except OSError as e:  # writing the help or a result to a stdout that takes nothing (a full disk)
            sys.stderr.write(f"depthlens: error: cannot write the output to stdout ({e.strerror or e})\n")
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the flush at exit does not fail again
            rv = 1
        rv = _flush_stdout(rv)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _pair_weights(args: Any) -> Any:
    """Each `--weights W` attached, in order, to a FILE.py:FUNCTION model argument (`adapters.userref`), so every
    command that takes checkpoint paths takes described models (docs/own-model.md); a bad pairing is a usage error."""
    argv = list(sys.argv[1:] if args is None else args)
    if not any(a == "--weights" or a.startswith("--weights=") for a in argv):
        return args
    from ..adapters.userref import pair_weights
    from ..errors import UsageError

    try:
        return pair_weights(argv)
    except UsageError as e:
        raise _click.exceptions.UsageError(str(e)) from None


THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def sanitise_thread_env() -> None:
    """A thread-count variable that is not a positive integer is dropped (with one note) before torch loads
    OpenMP, which would otherwise print its own complaint on every process start."""
    for name in THREAD_ENV:
        v = os.environ.get(name)
        if v is not None and not (v.strip().isdigit() and 0 < int(v) <= 4096):
            del os.environ[name]
            if not _other_rank():
                sys.stderr.write(f"depthlens: note: {name}={v[:40]!r} is not a positive integer; ignored\n")


def _flush_stdout(rv: Any) -> Any:
    """Flush what the command printed now, so a stdout that cannot take it (a closed pipe, a full disk) is one
    line and exit 1 instead of Python's "Exception ignored" at exit with the result lost."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as e:
        if sys.stderr is not None:
            sys.stderr.write(f"depthlens: error: cannot write the output to stdout ({e.strerror or e})\n")
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stays open until exit, so the final flush succeeds
        return 1
    return rv


class _Deferred(type):
    """A stand-in class for one rich class, which imports the real one on first use (a call or an attribute)."""

    _where: tuple[str, str]

    def _real(cls) -> Any:
        import importlib

        module, name = cls._where
        return getattr(importlib.import_module(module), name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls._real(), name)


def light_rich_utils() -> None:
    """Import typer.rich_utils (which renders every help page) without the two rich modules it imports at its top
    for what this CLI never shows: rich.markdown (markdown-it, pygments) for rich_markup_mode="markdown" (this
    app's is "rich") and rich.traceback (attrs, pretty) for pretty tracebacks (disabled). They are 40 % of
    `depthlens --help`. While typer.rich_utils loads, each is a stand-in module whose class imports the real one on
    first use; then the stand-ins leave sys.modules, so a later `import rich.markdown` gets the real module. Once
    per process; nothing when typer.rich_utils or the real module is already loaded."""
    import types

    if "typer.rich_utils" in sys.modules:
        return
    stand_ins = []
    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module in sys.modules:
            continue
        stub = types.ModuleType(module)
        setattr(stub, name, _Deferred(name, (), {"_where": (module, name), "__module__": module}))
        sys.modules[module] = stub
        stand_ins.append(module)
    try:
        import typer.rich_utils  # noqa: F401
    finally:
        for module in stand_ins:
            if sys.modules.get(module) is not None and not hasattr(sys.modules[module], "__file__"):
                del sys.modules[module]


def resolve_annotations(fn: Callable[..., Any]) -> None:
    """Evaluate the string annotations of a command function (`from __future__ import annotations`) once, in place:
    typer evaluates each string four times while it builds the command (signature and type hints, twice), which
    is a sixth of `depthlens --help`. Left as strings when one does not evaluate (typer then says why)."""
    import typing

    # a wrapper that states its own signature (`common.eval_options`) has its annotations evaluated already
    target = inspect.unwrap(fn, stop=lambda f: "__signature__" in vars(f))
    if not any(isinstance(a, str) for a in getattr(target, "__annotations__", {}).values()):
        return
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001  (typer's own evaluation reports it)
        return
    target.__annotations__ = hints
    if fn is not target:
        fn.__annotations__ = hints


class _App(typer.Typer):
    """The Typer app, started with its command annotations evaluated once and a light typer.rich_utils."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for info in [*self.registered_commands, self.registered_callback]:
            if info is not None and info.callback is not None:
                resolve_annotations(info.callback)
        light_rich_utils()
        return super().__call__(*args, **kwargs)


app = _App(
    name="depthlens",
    cls=OneLineErrors,
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Does this residual design turn extra layers into extra computation?",
)


QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress on stderr (a bar on a terminal, else a line per step).")
]


def _print_version(value: bool) -> None:
    if value:
        from .._version import __version__

        typer.echo(f"depthlens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the depthlens version and exit."
    ),
    no_cache: bool = typer.Option(
        False,
        "--no-cache",
        help="No caches: GGUF files dequantised again, every study result (report, compare, sweep, track) computed "
        "again, nothing stored; same as DEPTHLENS_NO_CACHE=1.",
    ),
) -> None:
    """Does this residual design turn extra layers into extra computation?"""
    if no_cache:
        os.environ["DEPTHLENS_NO_CACHE"] = "1"  # read by adapters.gguf_cache and studies.cache, here and in workers


def invoked_command() -> str | None:
    """The command line as given: `depthlens <command>`, then every argument and option the user set (on the
    command line or from the environment), in declaration order; options left at their default are omitted.
    From click's context, so it is exact under `python -m`, torchrun and test runners alike. None outside a
    command."""
    import shlex

    from typer._click.core import ParameterSource  # typer vendors click: its context, not the click package's
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    words = ctx.command_path.split()
    words[0] = "depthlens"
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        value = ctx.params.get(p.name)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if p.param_type_name == "argument":
            words += [str(v) for v in values]
            continue
        flag = max(p.opts, key=len)
        if getattr(p, "is_flag", False):
            if p.secondary_opts:  # --x/--no-x: the spelling that was given
                words.append(flag if value else max(p.secondary_opts, key=len))
            elif value:
                words.append(flag)
            continue
        for v in values:
            words += [flag, str(v)]
    return shlex.join(words)


DEFAULT_OUT_DIR = SCRATCH_DIR  # depthlens-out/: default home of command outputs (git-ignored), relative to the cwd


def in_default_dir(path: Path) -> bool:
    """Whether `path` lies directly in the default output folder (created when a command first writes there)."""
    return Path(path).parent.resolve() == DEFAULT_OUT_DIR.resolve()


def print_table(table: Any) -> None:
    """Print a rich table on stdout. A column is never narrower than its widest cell or header word (headers
    wrap at spaces), and a table that still does not fit is printed wider rather than cropped, so a pipe or log
    at 80 columns shows every digit (rich's default squeezes 406.2M into 406…)."""
    from rich.cells import cell_len
    from rich.console import Console
    from rich.measure import Measurement
    from rich.padding import Padding

    for col in table.columns:
        col.overflow = "fold"
        words = str(col.header).split() or [""]
        widest = max([cell_len(str(c)) for c in col._cells] + [cell_len(w) for w in words])
        col.min_width = max(col.min_width or 0, widest)
    con = Console()
    _, right, _, left = Padding.unpack(table.padding)
    need = sum(col.min_width + left + right for col in table.columns) + table._extra_width  # cells, edges, borders
    # rich's own natural width: at the sum of minimum widths it still crops a column whose cells cannot wrap
    need = max(need, Measurement.get(con, con.options.update(width=10**4), table).maximum)
    if need > con.width:  # wider than the terminal or the 80-column pipe default: widen rather than crop
        con = Console(width=need)
    con.print(table)


_rank0_voice = False  # set by rank0_errors on the ranks other than 0


def _other_rank() -> bool:
    """Under torchrun (WORLD_SIZE > 1), a rank other than 0. From the environment: no torch import."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and int(os.environ.get("RANK", "0") or 0) != 0


def deprecated(old: str, new: str) -> None:
    """One line on stderr for an old spelling that still works this version (`old` is removed in the next)."""
    if not _other_rank():
        sys.stderr.write(f"depthlens: note: {old} is deprecated and will be removed in the next version; use {new}\n")


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit with `code` (1 = domain error, 2 = usage)."""
    if not _rank0_voice:
        sys.stderr.write(f"depthlens: error: {message.splitlines()[0] if message else 'failed'}\n")
    raise typer.Exit(code)


def rank0_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Under torchrun, only rank 0 prints the error line; the other ranks exit with their code, silently. For
    commands whose ranks agree on failure (`report`: `distributed.agree` brings a failing rank's line to rank 0,
    and every other error is the same on every rank). Put it above @domain_errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _rank0_voice
        _rank0_voice = _other_rank()
        try:
            return fn(*args, **kwargs)
        finally:
            _rank0_voice = False

    return wrapper


def dumps(x: Any, **kw: Any) -> str:
    """Strict JSON for stdout: null, never NaN/Infinity (which no JSON parser accepts)."""
    import json

    from ..io.jsonsafe import jsonable

    return json.dumps(jsonable(x), allow_nan=False, default=str, **kw)


def domain_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into one stderr line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..errors import DepthlensError

        try:
            from . import feedback
            from .validate import check_options

            bound = dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
            feedback.QUIET = bool(bound.get("quiet", False))  # every command's progress follows its --quiet
            check_options(bound)  # before any work
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except DepthlensError as e:
            fail(str(e), 2 if getattr(e, "usage", False) else 1)
        except ValueError as e:
            if callable(getattr(e, "errors", None)) and type(e).__module__.startswith("pydantic"):
                from ..schema import one_line

                e = one_line(e)  # a schema violation not yet located in a file: still one line
            fail(str(e), 2 if getattr(e, "usage", False) else 1)
        except MemoryError:
            fail("out of memory (an input or an option asks for more than this machine has)", 1)
        except RecursionError:  # before RuntimeError, its base class
            fail("an input is nested too deeply to process", 1)
        except (OSError, RuntimeError) as e:
            fail(f"{e.__class__.__name__}: {e}", 1)
        finally:
            from . import feedback

            feedback.QUIET = False  # in-process callers (tests, notebooks) run the next command afresh

    return wrapper

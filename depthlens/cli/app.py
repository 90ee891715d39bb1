"""Typer app and the shared error handling: one clear line on stderr, exit 1 (domain) or 2 (usage)."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from typer import _click
from typer.core import TyperGroup


class OneLineErrors(TyperGroup):
    """Usage errors as one line on stderr (exit 2) instead of a multi-line panel."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra)
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
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(name="depthlens", cls=OneLineErrors, no_args_is_help=True, rich_markup_mode="rich",
                  pretty_exceptions_enable=False, add_completion=False,
                  help="Does this residual design turn extra layers into extra computation?")


_rank0_voice = False  # set by rank0_errors on the ranks other than 0


def _other_rank() -> bool:
    """Under torchrun (WORLD_SIZE > 1), a rank other than 0. From the environment: no torch import."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and int(os.environ.get("RANK", "0") or 0) != 0


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
            from .validate import check_options

            check_options(dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments))  # before any work
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except DepthlensError as e:
            fail(str(e), 1)
        except ValueError as e:
            fail(str(e), 2 if getattr(e, "usage", False) else 1)
        except (OSError, RuntimeError) as e:
            fail(f"{e.__class__.__name__}: {e}", 1)

    return wrapper


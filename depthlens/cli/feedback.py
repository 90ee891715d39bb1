"""Progress on stderr for the long commands (train, eval, info on large models), like causal and report.

Shown only when stderr is a terminal and the command is not asked for --json; otherwise silent, so pipes,
logs and `--json` consumers get exactly the output they asked for.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def active(as_json: bool = False) -> bool:
    return not as_json and stderr_is_tty()


def console() -> Any:
    from rich.console import Console

    return Console(stderr=True, force_terminal=stderr_is_tty())


@contextlib.contextmanager
def spinner(what: str, as_json: bool = False) -> Iterator[None]:
    """A spinner with `what` while a single long call runs (loading a large checkpoint)."""
    if not active(as_json):
        yield
        return
    with console().status(what, spinner="dots"):
        yield


@contextlib.contextmanager
def bar(what: str, total: int | None, as_json: bool = False) -> Iterator[Callable[..., None]]:
    """A progress bar; yields `advance(n=1, **fields)` (fields: e.g. loss=..., shown after the bar)."""
    if not active(as_json):
        yield lambda n=1, **fields: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn(f"[bold]{what}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console(), transient=True) as p:
        task = p.add_task(what, total=total, info="")

        def advance(n: int = 1, **fields: Any) -> None:
            info = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()
                             if v is not None)
            p.update(task, advance=n, info=info)

        yield advance

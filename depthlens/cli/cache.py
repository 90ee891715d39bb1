"""The `cache` commands: list and clear the GGUF cache (dequantised GGUF weights, `adapters.gguf_cache`)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from .app import OneLineErrors, app, domain_errors, dumps, fail, print_table

cache_app = typer.Typer(
    name="cache",
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    help="The GGUF cache: dequantised GGUF weights kept by content hash (list, clear).",
)
app.add_typer(cache_app)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@cache_app.command("list")
@domain_errors
def list_entries(
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON to stdout.")] = False,
) -> None:
    """Every cache entry (least recently used first), its size, and the cache's folder and size limit."""
    from ..adapters import gguf_cache

    es = gguf_cache.entries()
    info = {
        "dir": str(gguf_cache.cache_dir()),
        "max_bytes": gguf_cache.max_bytes(),
        "total_bytes": sum(e["bytes"] for e in es),
        "entries": es,
    }
    if as_json:
        typer.echo(dumps(info, indent=2, sort_keys=True))
        return
    from rich.table import Table

    t = Table(title=f"{info['dir']}: {len(es)} entries, {_size(info['total_bytes'])} of {_size(info['max_bytes'])}")
    for col in ("key", "GGUF file", "dtype", "size", "last used"):
        t.add_column(col)
    for e in es:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["last_used"]))
        t.add_row(e["key"][:16], e["gguf_name"], e["dtype"], _size(e["bytes"]), used)
    print_table(t)


@cache_app.command("clear")
@domain_errors
def clear_entries(
    keys: Annotated[
        list[str] | None, typer.Argument(help="Key prefixes (as `cache list` shows them); none: every entry.")
    ] = None,
) -> None:
    """Remove cache entries: those whose key starts with one of KEYS, or all of them."""
    from ..adapters import gguf_cache

    gone = gguf_cache.clear(keys or None)
    if keys and not gone:
        fail(f"no cache entry starts with {', '.join(keys)} (see `depthlens cache list`)")
    typer.echo(f"removed {len(gone)} cache entr{'y' if len(gone) == 1 else 'ies'} from {gguf_cache.cache_dir()}")

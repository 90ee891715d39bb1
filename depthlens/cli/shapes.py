"""The `shapes` command: the iso-parameter shape planner."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from ..designs import SLUGS
from .app import app, domain_errors, dumps, fail, print_table

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def parse_count(text: str) -> float:
    """'407M' -> 4.07e8, '250k' -> 2.5e5, '1e6' -> 1e6."""
    t = text.strip().lower()
    try:
        n = float(t[:-1]) * _SUFFIX[t[-1]] if t and t[-1] in _SUFFIX else float(t)
    except ValueError:
        fail(f"cannot read a parameter count from {text!r} (examples: 407M, 250k, 1.6B)", 2)
        raise  # unreachable
    if not (math.isfinite(n) and 1e5 <= n <= 1e13):
        fail(f"--target must be a parameter count between 100k and 10T; got {text!r}", 2)
    return n


def parse_list(text: str | None, kind=float, option: str = "--depths", hi: float = 10_000) -> list | None:
    """A comma-separated list of positive numbers (at most `hi`, at most 1000 of them)."""
    if text is None:
        return None
    try:
        out = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        fail(f"{option}: cannot read a comma-separated list of numbers from {text!r}", 2)
        raise
    if not out or len(out) > 1000 or not all(math.isfinite(v) and 0 < v <= hi for v in out):
        fail(f"{option} must list 1 to 1000 numbers in (0, {hi:g}]; got {text!r}", 2)
    return out


@app.command()
@domain_errors
def shapes(
    target: Annotated[str, typer.Option(help="Total-parameter target, e.g. 407M.")] = "407M",
    depths: Annotated[str | None, typer.Option(help="Comma-separated depths L (default: the paper's sweep).")] = None,
    aspect_ratios: Annotated[
        str | None, typer.Option("--aspect-ratios", help="Comma-separated target d/L instead of depths.")
    ] = None,
    design: Annotated[str, typer.Option(help=f"Residual design ({', '.join(SLUGS)}).")] = "preln",
    vocab_size: Annotated[int, typer.Option(min=1)] = 50257,
    multiple: Annotated[int, typer.Option(min=1, help="d_model is a multiple of this.")] = 64,
    head_dim: Annotated[int, typer.Option(min=1)] = 64,
    n_kv_head: Annotated[int | None, typer.Option(min=1, help="GQA KV heads (default: MHA).")] = None,
    ffn_multiple: Annotated[int | None, typer.Option(min=1, help="Round d_ff = 8/3 d up to this multiple.")] = None,
    tie_embeddings: Annotated[bool, typer.Option("--tie-embeddings")] = False,
    seq_len: Annotated[int, typer.Option(min=1, help="Training context for FLOPs/token.")] = 2048,
    prefill_len: Annotated[int, typer.Option(min=1, help="Context for prefill FLOPs and KV cache.")] = 4096,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Iso-parameter shapes: d_model per depth, parameters, FLOPs, prefill cost and KV-cache bytes."""
    from ..designs import check_design
    from ..errors import DepthlensError
    from ..training.shapes import plan

    try:
        check_design(design)
    except ValueError as e:
        fail(f"--design: {e}", 2)
    kw = dict(head_dim=head_dim, tie_embeddings=tie_embeddings)
    if n_kv_head is not None:
        kw["n_kv_head"] = n_kv_head
    if ffn_multiple is not None:
        kw["ffn_multiple"] = ffn_multiple
    try:  # every input of `shapes` is an option: whatever the planner refuses is a usage error
        rows = plan(
            parse_count(target),
            depths=parse_list(depths, int),
            aspect_ratios=parse_list(aspect_ratios, float, "--aspect-ratios"),
            design=design,
            vocab_size=vocab_size,
            multiple=multiple,
            seq_len=seq_len,
            prefill_len=prefill_len,
            **kw,
        )
    except (ValueError, DepthlensError) as e:
        fail(str(e), 2)
    if as_json:
        typer.echo(dumps([r.to_dict() for r in rows], indent=2))
        return
    from rich.table import Table

    t = Table(title=f"{design}: iso-parameter shapes at {parse_count(target) / 1e6:.1f}M total")
    for col in (
        "L",
        "d",
        "heads",
        "d/L",
        "total",
        "non-emb",
        "overhead",
        "Δ target",
        "train GFLOP/tok",
        f"prefill TFLOP@{prefill_len}",
        "KV MB",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r.n_layer),
            str(r.d_model),
            str(r.n_head),
            f"{r.aspect_ratio:.1f}",
            f"{r.total / 1e6:.1f}M",
            f"{r.non_embedding / 1e6:.1f}M",
            f"{r.overhead:,}",
            f"{100 * r.rel_error:+.1f}%",
            f"{r.train_flops_per_token / 1e9:.2f}",
            f"{r.prefill_flops / 1e12:.2f}",
            f"{r.kv_cache_bytes / 1e6:.1f}",
        )
    print_table(t)

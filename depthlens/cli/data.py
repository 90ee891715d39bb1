"""Data commands: prepare (tokenize local files or the offline corpus into shards)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, domain_errors, dumps, fail


@app.command()
@domain_errors
def prepare(
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="Local .txt / .md / .jsonl / .parquet files. Omit to build the offline corpus."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory for the shards and manifest.json.")] = Path(
        "depthlens-out/corpus"
    ),
    tokenizer: Annotated[str, typer.Option(help="bytes | gpt2 | bpe:<dir or tokenizer.json>")] = "bytes",
    val_fraction: Annotated[float, typer.Option(min=0.0, max=0.5)] = 0.05,
    text_field: Annotated[str, typer.Option(help="JSONL/parquet field holding the text.")] = "text",
    max_bytes: Annotated[int | None, typer.Option(min=1, help="Cap the offline corpus size (bytes of text).")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    fineweb: Annotated[
        bool, typer.Option("--fineweb-instructions", help="Print how to fetch FineWeb-Edu shards, then exit.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing depthlens dataset at --out.")
    ] = False,
) -> None:
    """Tokenize text into token shards (256 x int32 header + uint16 ids, uint32 for vocabularies over 65,536; FineWeb-Edu compatible)."""
    from ..data.corpus import build_corpus, fineweb_instructions, prepare_files
    from ..data.tokenizers import get_tokenizer

    if fineweb:
        typer.echo(fineweb_instructions())
        return
    from ..io.atomic import check_target

    tok = get_tokenizer(tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)  # `--out data/mine` in a fresh clone: data/ is not there yet
    check_target(out, overwrite, kinds=("dataset",))  # before any tokenizing
    if files:
        manifest = prepare_files(files, out, tok, val_fraction, text_field=text_field, seed=seed, overwrite=overwrite)
    else:
        if val_fraction <= 0:
            fail("the offline corpus needs a validation split: --val-fraction > 0", 2)
        manifest = build_corpus(
            out, tok, max_bytes=max_bytes, val_fraction=val_fraction, seed=seed, overwrite=overwrite
        )
    summary = {
        "out": str(out),
        "tokenizer": tok.name,
        "n_tokens": {s: v.get("n_tokens") for s, v in manifest.get("splits", {}).items()},
        "data_hash": manifest.get("data_hash"),
    }
    typer.echo(dumps(summary, indent=2) if as_json else "\n".join(f"{k}: {v}" for k, v in summary.items()))

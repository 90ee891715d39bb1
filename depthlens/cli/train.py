"""Training command: `depthlens train RECIPE [key=value ...]` (works under torchrun too)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from .app import QuietOpt, app, deprecated, domain_errors, dumps


@app.command()
@domain_errors
def train(
    recipe: Annotated[Path, typer.Argument(help="Recipe JSON (one run, or a grid with base + runs).")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="run=NAME (a run of a grid recipe) and key=value overrides, e.g. run=hc_l8 steps=200 model.n_layer=8"
        ),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option(help="Run name inside a grid recipe (same as run=NAME; under torchrun write run=NAME)."),
    ] = None,
    list_runs: Annotated[bool, typer.Option("--list", help="List the recipe's runs and exit.")] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Run directory (logs, resume state, snapshots); the recipe's out= otherwise."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's summary as JSON.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Train a model from a committed recipe; resumable, seeded; exports a depthlens checkpoint.

    Multi-GPU: `torchrun --standalone --nproc_per_node=8 -m depthlens.cli train RECIPE run=NAME ...`.
    """
    from ..errors import DataError
    from ..io.files import regular_file
    from ..training.config import RunConfig, read_recipe, recipe_runs
    from ..training.trainer import run_recipe, split_run_name

    regular_file(recipe, "a recipe")  # a FIFO or a device is refused by name, before anything is read
    if list_runs:
        runs = recipe_runs(read_recipe(recipe), recipe)
        for name, fields in runs.items():  # every run validated: a listed run is one that loads
            RunConfig.from_dict(fields, recipe if len(runs) == 1 else f"{recipe} (run {name})")
        typer.echo("\n".join(runs))
        return
    from ..training.config import load_recipe
    from ..training.outputs import check_recipe_export
    from .feedback import bar

    overrides, run = split_run_name(overrides or [], run)
    if any(o.startswith("out=") for o in overrides):
        deprecated("the override out=DIR", "--out DIR (the one way every command names its output)")
    if out is not None:
        overrides = [*(o for o in overrides if not o.startswith("out=")), f"out={out}"]
    cfg = load_recipe(recipe, overrides, run=run)  # validated before any work; also sizes the bar
    check_recipe_export(recipe, overrides, run)  # said before any data is built or a step is trained
    main = int(os.environ.get("RANK", "0")) == 0
    missing = no_shards(Path(cfg.data))
    raw = read_recipe(recipe)
    if missing and raw.get("corpus") is not None:
        build_corpus_block(raw, Path(cfg.data))
    with bar(f"train {cfg.name or recipe.stem}", cfg.steps, show=main, every=10.0) as advance:
        advance(0)

        def progress(step: int, rec: dict) -> None:
            advance(1, loss=rec.get("loss"), val=rec.get("val_loss"), **{"tok/s": rec.get("tok_s")})

        try:
            record = run_recipe(recipe, overrides, run=run, callback=progress)
        except DataError as e:  # the trainer's own checks (memory, ...) come first; then say how to get the data
            if missing and raw.get("corpus") is None:
                raise DataError(missing_data_message(Path(cfg.data), cfg.tokenizer)) from e
            raise
    if int(os.environ.get("RANK", "0")) == 0:
        keys = ("name", "steps", "tokens", "final_val_loss", "wall_time_s", "checkpoint", "stopped")
        summary = {k: record[k] for k in keys if k in record}
        if as_json:
            typer.echo(dumps(summary))
        else:
            typer.echo(summary_line(summary))


def summary_line(s: dict) -> str:
    """The run in one line: 'hc_l4: 100 steps, 819,200 tokens, val loss 2.134 nats, 31.2 s; checkpoint X'."""
    val = s.get("final_val_loss")
    parts = [
        f"{s.get('steps')} steps",
        f"{s['tokens']:,} tokens" if isinstance(s.get("tokens"), int) else None,
        f"val loss {val:.3f} nats" if isinstance(val, float) else None,
        f"{s['wall_time_s']:.1f} s" if isinstance(s.get("wall_time_s"), (int, float)) else None,
        f"stopped: {s['stopped']}" if s.get("stopped") else None,
    ]
    ckpt = f"; checkpoint {s['checkpoint']}" if s.get("checkpoint") else ""
    return f"{s.get('name') or 'train'}: " + ", ".join(p for p in parts if p) + ckpt


def no_shards(data: Path) -> bool:
    """A fresh clone has no token shards yet (no manifest and no .bin files at the recipe's data path)."""
    from ..data.shards import read_manifest

    return read_manifest(data) is None and not (data.is_dir() and any(data.glob("*.bin")))


def build_corpus_block(raw: dict, data: Path) -> None:
    """Build the corpus the recipe's `corpus` block describes into `data`, with progress lines on stderr. Only
    where nothing is there yet, so this never changes the data an existing run trains on."""
    import sys

    from ..errors import DataError
    from ..training.recipes import corpus_command, prepare_zoo_data

    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:  # ranks must not build one directory concurrently
        raise DataError(
            f"{data}: no token shards; build them once before torchrun: `{corpus_command(raw['corpus'], data)}`"
        )
    prepare_zoo_data(raw, data, log=lambda line: print(f"depthlens train: {line}", file=sys.stderr, flush=True))


def missing_data_message(data: Path, tokenizer: str) -> str:
    import shlex

    out, tok = shlex.quote(str(data)), shlex.quote(tokenizer)
    return (
        f"{data}: no token shards, and the recipe has no corpus block to build them from; build them with "
        f"`depthlens prepare --out {out} --tokenizer {tok}` (the offline corpus) or "
        f"`depthlens prepare FILES... --out {out} --tokenizer {tok}`"
    )

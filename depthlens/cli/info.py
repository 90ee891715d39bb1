"""The `info` command: design, shape and parameter counts of a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .app import QuietOpt, app, domain_errors, dumps, print_table

CkptArg = Annotated[Path, typer.Argument(help="Checkpoint: depthlens or Hugging Face directory, or a GGUF file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON to stdout.")]


@app.command()
@domain_errors
def info(ckpt: CkptArg, as_json: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """Design, shape and parameter counts (total, non-embedding, overhead vs Pre-LN) of a checkpoint."""
    s = _stored_gguf_info(Path(ckpt))
    if s is None:
        from ..adapters.gguf_cache import store_info
        from ..adapters.load import describe, describe_native, open_model
        from .feedback import spinner

        with spinner(f"loading {Path(ckpt).name}") as p:
            # a depthlens checkpoint is described from its config and weight file without torch; anything else (or
            # a checkpoint that fails a check: the model path says why) opens the model
            s = describe_native(ckpt) or describe(open_model(ckpt, progress=p.engine()))
        store_info(s)  # a GGUF file opened through the cache: the next `info` on its bytes reads this
    s["checkpoint"] = str(ckpt)
    if s.get("code_version_warning"):
        typer.echo(f"depthlens: warning: {s['code_version_warning']}", err=True)
    if as_json:
        typer.echo(dumps(s, indent=2, sort_keys=True))
        return
    from rich.table import Table

    t = Table(title=f"{ckpt}", show_header=False)
    for k in (
        "design",
        "design_name",
        "model_source",
        "model_family",
        "adapter_path",
        "gguf_quantization",
        "model_tokenizer",
        "n_layer",
        "d_model",
        "n_head",
        "n_kv_head",
        "d_ff",
        "vocab_size",
        "aspect_ratio",
        "params_total",
        "params_non_embedding",
        "params_design_overhead",
        "overhead_vs_preln",
        "val_loss",
        "trained_at_commit",
    ):
        if k in s and s[k] is not None:
            v = s[k]
            t.add_row(k, f"{v:,}" if isinstance(v, int) else (f"{v:.4g}" if isinstance(v, float) else str(v)))
    print_table(t)


def _stored_gguf_info(p: Path) -> dict[str, Any] | None:
    """What an earlier `info` printed for these GGUF bytes (`gguf_cache.stored_info`: the file is hashed, its
    weights not read), or None: not a GGUF file, the cache off, or no sound record for this file and code."""
    from ..adapters.gguf_cache import stored_info

    try:
        if not p.is_file():  # never opened otherwise: a FIFO named like a .gguf would block the reader
            return None
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
    except OSError:
        return None  # the full open says what is wrong with it
    return stored_info(p)

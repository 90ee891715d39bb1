"""Model inspection commands: info, hooks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .app import app, domain_errors

CkptArg = Annotated[Path, typer.Argument(help="Checkpoint: depthlens or Hugging Face directory, or a GGUF file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON to stdout.")]


@app.command()
@domain_errors
def info(ckpt: CkptArg, as_json: JsonOpt = False) -> None:
    """Design, shape and parameter counts (total, non-embedding, overhead vs Pre-LN) of a checkpoint."""
    from ..adapters.load import describe, open_model

    s = describe(open_model(ckpt))
    s["checkpoint"] = str(ckpt)
    if as_json:
        typer.echo(json.dumps(s, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{ckpt}", show_header=False)
    for k in ("design", "design_name", "model_source", "model_family", "adapter_path", "gguf_quantization",
              "model_tokenizer", "n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab_size",
              "aspect_ratio", "params_total", "params_non_embedding", "params_design_overhead", "overhead_vs_preln",
              "val_loss"):
        if k in s and s[k] is not None:
            v = s[k]
            t.add_row(k, f"{v:,}" if isinstance(v, int) else (f"{v:.4g}" if isinstance(v, float) else str(v)))
    Console().print(t)


@app.command()
@domain_errors
def hooks(ckpt: CkptArg, as_json: JsonOpt = False) -> None:
    """List every hook point and readout of a checkpoint's model."""
    import torch

    from ..adapters.load import open_model
    from ..models.readouts import parse_readout_key

    m = open_model(ckpt).model
    names = m.hook_names()
    readouts: list[str] = []
    if hasattr(m, "readouts"):  # native designs; foreign models expose hook points only
        toks = torch.zeros(1, min(4, m.config.max_seq_len), dtype=torch.long)
        r = m.readouts(toks)
        keys = [(k, parse_readout_key(k)) for k in r]  # per-sublayer and static names once; others in full
        readouts = sorted({p.name if p.static or p.sublayer is not None else k for k, p in keys})
    if as_json:
        typer.echo(json.dumps({"hooks": names, "readouts": readouts, "resid_view": m.design.view_name,
                               "resid_view_editable": m.design.editable_view}, indent=2))
        return
    typer.echo(f"# hook points ({len(names)}); hook_resid_* = {m.design.view_name}"
               f" ({'editable' if m.design.editable_view else 'read-only'})")
    for n in names:
        typer.echo(n)
    if readouts:
        typer.echo("# readouts per sublayer (model.readouts(tokens)['sub<j>.<name>'])")
    for r in readouts:
        typer.echo(r)

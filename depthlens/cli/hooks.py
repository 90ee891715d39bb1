"""The `hooks` command: every hook point and readout of a checkpoint's model."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .app import QuietOpt, app, domain_errors
from .info import CkptArg, JsonOpt


@app.command()
@domain_errors
def hooks(ckpt: CkptArg, as_json: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """List every hook point and readout of a checkpoint's model."""
    import torch

    from ..adapters.load import open_model
    from ..models.readouts import parse_readout_key
    from .feedback import spinner

    with spinner(f"loading {Path(ckpt).name}") as p:  # a GGUF takes about a minute
        m = open_model(ckpt, progress=p.engine()).model
    names = m.hook_names()
    readouts: list[str] = []
    if hasattr(m, "readouts"):  # native designs; foreign models expose hook points only
        toks = torch.zeros(1, min(4, m.config.max_seq_len), dtype=torch.long)
        r = m.readouts(toks)
        keys = [(k, parse_readout_key(k)) for k in r]  # per-sublayer and static names once; others in full
        readouts = sorted({p.name if p.static or p.sublayer is not None else k for k, p in keys})
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "hooks": names,
                    "readouts": readouts,
                    "resid_view": m.design.view_name,
                    "resid_view_editable": m.design.editable_view,
                },
                indent=2,
            )
        )
        return
    typer.echo(
        f"# hook points ({len(names)}); hook_resid_* = {m.design.view_name}"
        f" ({'editable' if m.design.editable_view else 'read-only'})"
    )
    for n in names:
        typer.echo(n)
    if readouts:
        typer.echo("# readouts per sublayer (model.readouts(tokens)['sub<j>.<name>'])")
    for r in readouts:
        typer.echo(r)

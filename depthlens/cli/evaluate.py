"""Evaluation command: validation loss on the offline corpus and teacher-forced NLL on domain sets."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from ..runtime.defaults import DEFAULT_N_SEQ
from .app import QuietOpt, app, domain_errors, dumps, fail


@app.command("eval")
@domain_errors
def evaluate(
    ckpt: Annotated[Path, typer.Argument(help="Checkpoint: depthlens or Hugging Face directory, or a GGUF file.")],
    data: Annotated[
        Path | None, typer.Option(help="Eval text/JSONL/shard dir (default: held-out offline corpus).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Override the checkpoint's tokenizer (bytes | gpt2 | bpe:<path>).")
    ] = None,
    n_seq: Annotated[int, typer.Option("--n-seq", min=1, help="Validation sequences.")] = DEFAULT_N_SEQ,
    seq_len: Annotated[
        int | None,
        typer.Option("--seq-len", min=2, help="Validation sequence length (default: model max, at most 1024)."),
    ] = None,
    humaneval: Annotated[
        bool, typer.Option("--humaneval/--no-humaneval", help="Teacher-forced NLL on HumanEval (offline).")
    ] = True,
    jsonl: Annotated[
        list[str] | None, typer.Option("--jsonl", help="NAME=FILE[:prompt_field,answer_field]; presets gsm8k, mbpp.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many items per domain set.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    dtype: Annotated[
        str,
        typer.Option("--dtype", help="fp32 | bf16 | fp64 (weights and activations; losses are summed in fp32/fp64)."),
    ] = "fp32",
    as_json: Annotated[bool, typer.Option("--json")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Validation loss (nats/token) and domain NLL (nats per answer token) of a checkpoint."""
    import torch

    from ..adapters.load import open_model
    from ..data.tokenizers import get_tokenizer
    from ..diagnostics.nll import PRESETS, humaneval_items, jsonl_items, perplexity, teacher_forced_nll
    from ..errors import DepthlensError
    from ..runtime.evaldata import load_eval_data, model_device
    from ..studies.api import _tokenizer_for
    from .feedback import bar, spinner
    from .validate import input_path

    specs = []  # --jsonl parsed before any work
    for spec in jsonl or []:
        name, _, rest = spec.partition("=")
        if not rest:
            fail(f"--jsonl expects NAME=FILE[:prompt,answer], got {spec!r}", 2)
        file, _, fields = rest.partition(":")
        if fields:
            pf, _, af = fields.partition(",")
        elif name in PRESETS:
            pf, af = PRESETS[name]
        else:
            fail(f"--jsonl {name}: give the fields as {name}=FILE:prompt_field,answer_field", 2)
        input_path(Path(file), f"--jsonl {name}")
        specs.append((name, file, pf, af))

    from ..diagnostics.registry import DTYPES, load_dtype
    from .analyze import check_choice

    check_choice(dtype, tuple(DTYPES), "--dtype")
    with spinner(f"loading {Path(ckpt).name}") as p:
        model = open_model(ckpt, device=device, dtype=load_dtype(dtype), tokenizer=tokenizer, progress=p.engine()).model
    tok = _tokenizer_for(ckpt, model)
    tok = get_tokenizer(tok) if isinstance(tok, str) else tok
    T = seq_len or min(model.config.max_seq_len, 1024)  # foreign models may allow 8k+ positions
    ev = load_eval_data(data, tok, n_seq=n_seq, seq_len=T, seed=seed, max_seq_len=model.config.max_seq_len)
    from .validate import note_capped

    note_capped(ev)
    ev.check_model(model.config.vocab_size, model.config.max_seq_len)
    total, count = 0.0, 0
    per = max(1, 8192 // T)
    with torch.no_grad(), bar("eval", -(-ev.n_seq // per)) as advance:
        for _, toks in ev.batches(per):
            toks = toks.to(model_device(model))
            logits = model(toks[:, :-1]).float()  # (b, T-1, V) fp32 before the softmax, whatever the weights' dtype
            tgt = toks[:, 1:].to(logits.device)  # the head may sit on another device than the embedding
            nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.reshape(-1), reduction="sum")
            total, count = total + float(nll), count + toks[:, 1:].numel()
            advance(1, loss=total / count)
    if not math.isfinite(total / count):  # weights are finite (checked on load): the forward pass overflowed
        raise DepthlensError(
            f"{ckpt}: the validation loss is not finite ({total / count}): the model's activations "
            "overflow in this dtype; no loss to report"
        )
    result = {
        "checkpoint": str(ckpt),
        "design": model.config.arch,
        "n_layer": model.config.n_layer,
        "val_loss": total / count,
        "val_tokens": count,
        "val_data": ev.name,
        "val_data_sha256": ev.sha256,
        "tokenizer": getattr(tok, "name", "?"),
        "domain": {},
    }
    sets = [("humaneval", humaneval_items())] if humaneval else []
    sets += [(name, jsonl_items(file, pf, af)) for name, file, pf, af in specs]
    with bar("domain NLL", len(sets)) as advance:
        for name, items in sets:
            r = teacher_forced_nll(model, tok, items, limit=limit)
            result["domain"][name] = {k: v for k, v in r.items() if k != "per_item"}
            advance(1)
    if as_json:
        typer.echo(dumps(result, indent=2))
        return
    ppl = perplexity(result["val_loss"])
    ppl_text = f"{ppl:.2f}" if math.isfinite(ppl) else "beyond float range: exp(loss) overflows"
    typer.echo(
        f"{ckpt}: val loss {result['val_loss']:.4f} nats/token (ppl {ppl_text}) on {count:,} tokens of {ev.name}"
    )
    for name, r in result["domain"].items():
        typer.echo(
            f"  {name}: NLL {r['nll']:.4f} nats/answer-token over {r['n_items']} items "
            f"({r['n_answer_tokens']:,} tokens, {r['n_truncated']} truncated)"
        )

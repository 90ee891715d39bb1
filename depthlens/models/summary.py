"""Parameter accounting of a built model (counted from the tensors, not from formulas)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..designs import DESIGNS


def summarize(model: Any) -> dict[str, Any]:
    """Design, shape and parameter counts. Overhead = parameters outside the Pre-LN backbone."""
    params = dict(model.named_parameters())  # tied weights appear once
    return summarize_counts(model.config, ((n, p.numel()) for n, p in params.items()))


def summarize_counts(cfg: Any, numels: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """`summarize` from (parameter name, element count) pairs, each parameter once: those of a built model, or
    the tensors of a checkpoint's safetensors header (`depthlens info` without torch, adapters.load)."""
    counts = dict(numels)
    total = sum(counts.values())
    emb = sum(c for n, c in counts.items() if n.startswith(("embed_tokens.", "lm_head.")))
    backbone = sum(
        c
        for n, c in counts.items()
        if n.startswith(("embed_tokens.", "lm_head.", "norm."))
        or (
            n.startswith("blocks.")
            and n.split(".")[2] in ("attn", "mlp")
            and ".post_norm." not in n
            and ".depth_" not in n
        )
    )
    overhead = total - backbone
    return {
        "design": cfg.arch,
        "design_name": DESIGNS[cfg.arch].name,
        "n_layer": cfg.n_layer,
        "d_model": cfg.d_model,
        "n_head": cfg.n_head,
        "n_kv_head": cfg.kv_heads,
        "d_ff": cfg.ffn_dim,
        "vocab_size": cfg.vocab_size,
        "aspect_ratio": cfg.d_model / cfg.n_layer,
        "params_total": total,
        "params_embedding": emb,
        "params_non_embedding": total - emb,
        "params_design_overhead": overhead,
        "overhead_vs_preln": overhead / max(total - overhead, 1),
        "tie_embeddings": cfg.tie_embeddings,
    }

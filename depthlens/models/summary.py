"""Parameter accounting of a built model (counted from the tensors, not from formulas)."""

from __future__ import annotations

from typing import Any

from ..designs import DESIGNS


def summarize(model: Any) -> dict[str, Any]:
    """Design, shape and parameter counts. Overhead = parameters outside the Pre-LN backbone."""
    cfg = model.config
    params = dict(model.named_parameters())  # tied weights appear once
    total = sum(p.numel() for p in params.values())
    emb = sum(p.numel() for n, p in params.items() if n.startswith(("embed_tokens.", "lm_head.")))
    backbone = sum(
        p.numel()
        for n, p in params.items()
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

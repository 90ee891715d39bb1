"""A user's Attention-Residuals LM built with kyegomez's `attn-res` (pip install attn-res==0.1.0): the package's own
`AttnResTransformer`, Full or Block. Nothing here knows depthlens but the adapter at the end.

attn-res runs its depth loop inside the model's forward over a growing list of sources, and its final output is the
plain SUM of the sources (no final AttnRes operator); its key norm is weightless (the gain lives in the query).
"""

from __future__ import annotations

import torch
from attn_res import AttnResMode, AttnResTransformer, TransformerConfig
from torch import nn

import depthlens


def tiny(mode: str = "full", eps: float = 1e-6, n_layer: int = 4, d: int = 32, vocab: int = 97) -> AttnResTransformer:
    """A small Full or Block (2 blocks) AttnRes model: n_layer Transformer layers = 2 n_layer attn-res sublayers."""
    cfg = TransformerConfig(
        d_model=d,
        n_layers=2 * n_layer,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=vocab,
        max_seq_len=64,
        ffn_mult=3.0,
        attn_res_mode=AttnResMode.FULL if mode == "full" else AttnResMode.BLOCK,
        n_blocks=2,
        eps=eps,
    )
    return AttnResTransformer(cfg)


# --- the adapter: what depthlens needs to know about this model (docs/own-model.md#worked-adapters) ----------


class Layer(nn.Module):
    """One layer (attention + MLP sublayer) of attn-res's loop, on a state of fixed size: src (B, T, S, d) =
    [b_0 = embedding, completed blocks, the partial sum, zeros], i (B, T) = sublayers run so far (Full: blocks of 1)."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, bs: int, freqs: torch.Tensor):
        super().__init__()
        self.attn, self.mlp, self.bs, self.mix = attn, mlp, bs, []
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, s: dict) -> dict:
        src, i, T = s["src"].clone(), int(s["i"][0, 0]), s["src"].shape[1]
        mask, self.mix = torch.full((T, T), float("-inf"), device=src.device).triu(1), []
        for layer in (self.attn, self.mlp):
            v = src[:, :, : 1 if i == 0 else 2 + (i - 1) // self.bs].movedim(2, 0)  # the sources attn-res stacks
            op, own = layer.attn_res, i > 0 and i % self.bs > 0  # own: the last source is this block's partial
            alpha = torch.einsum("d,nbtd->btn", op.pseudo_query, op.key_norm(v)).softmax(-1)
            labels = ["emb", *(f"block_{m}" for m in range(1, len(v) - own))] + ["partial"] * own
            self_w = alpha[..., -1] if own or (self.bs == 1 and i > 0) else torch.full_like(alpha[..., 0], torch.nan)
            self.mix.append(
                {"alpha": alpha, "self_weight": self_w} | ({"source_labels": labels} if self.bs > 1 else {})
            )
            src[:, :, 1 + i // self.bs] += layer(v, self.freqs[:T], mask)
            i += 1
        return {"src": src, "i": s["i"] + 2}


def describe(model: AttnResTransformer):
    """depthlens's view of `model`: the sources as a fixed-size state; a block is one Transformer layer."""
    c, ls = model.cfg, model.layers
    bs = 1 if c.attn_res_mode == AttnResMode.FULL else c.block_size
    layers = nn.ModuleList(Layer(ls[2 * k], ls[2 * k + 1], bs, model.rope_freqs) for k in range(len(ls) // 2))
    S = 2 + (len(ls) - 1) // bs  # b_0, every completed block, the partial

    def embed(tokens):
        h = model.token_emb(tokens)
        src = torch.cat([h[:, :, None], h.new_zeros(*h.shape[:2], S - 1, h.shape[-1])], 2)
        return {"src": src, "i": torch.zeros(tokens.shape, dtype=torch.long, device=tokens.device)}

    return depthlens.wrap(
        nn.ModuleDict({"model": model, "layers": layers}),
        embed=embed,
        blocks=layers,
        head=lambda s: model.lm_head(model.out_norm(s["src"].sum(2))),  # attn-res's output: the sum of the sources
        view=lambda s: s["src"].sum(2),
        sublayers=lambda layer: (layer.attn, layer.mlp),
        mixing=lambda layer: layer.mix if layer is not None else {},
        design=f"attnres-{c.attn_res_mode.value}",
        max_seq_len=c.max_seq_len,
    )

"""A user's Attention-Residuals LM built with kyegomez's `attn-res` (pip install attn-res==0.1.0): the package's own
`AttnResTransformer`, Full or Block. Nothing here knows depthlens but the adapter at the end.

attn-res runs its depth loop inside the model's forward over a growing list of sources, and its final output is the
plain SUM of the sources (no final AttnRes operator); its key norm is weightless (the gain lives in the query).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attn_res import AttnResMode, AttnResTransformer, TransformerConfig
from torch import nn

import depthlens


def tiny(mode: str = "full", eps: float = 1e-6, n_layer: int = 4, d: int = 32, vocab: int = 257) -> AttnResTransformer:
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


def describe(model: AttnResTransformer | None = None):
    """depthlens's view of `model`: attn-res's sources as a state of fixed size, src (B, T, 1 + 2L, d) = [b_0 = embedding,
    completed blocks, the partial sum, zeros] and i (B, T) = sublayers run so far; a block is one Transformer layer
    (attention + MLP sublayer); Full AttnRes is Block AttnRes with blocks of one sublayer."""
    model = tiny("full") if model is None else model  # the CLI calls describe() and loads --weights into it
    ls, bs = model.layers, 1 if model.cfg.attn_res_mode == AttnResMode.FULL else model.cfg.block_size  # per block

    class Layer(nn.ModuleList):  # attn-res's loop over two sublayers, with what depthlens reads of its depth softmax
        def forward(self, s):
            src, T = s["src"].clone(), s["src"].shape[1]
            mask, self.mix = torch.full((T, T), float("-inf"), device=src.device).triu(1), []
            for i, sub in enumerate(self, start=int(s["i"][0, 0])):
                v = src[:, :, : 1 if i == 0 else 2 + (i - 1) // bs].movedim(2, 0)  # the sources attn-res stacks
                own = i > 0 and i % bs > 0  # the last source is this block's partial sum
                alpha = torch.einsum("d,nbtd->btn", sub.attn_res.pseudo_query, sub.attn_res.key_norm(v)).softmax(-1)
                labels = ["emb", *(f"block_{m}" for m in range(1, len(v) - own))] + ["partial"] * own
                self_w = alpha[..., -1] if own or (bs == 1 and i > 0) else torch.full_like(alpha[..., 0], torch.nan)
                self.mix.append({"alpha": alpha, "self_weight": self_w} | ({"source_labels": labels} if bs > 1 else {}))
                src[:, :, 1 + i // bs] += sub(v, model.rope_freqs[:T], mask)
            return {"src": src, "i": s["i"] + 2}

    model.depth_layers = nn.ModuleList(Layer(ls[k : k + 2]) for k in range(0, len(ls), 2))
    return depthlens.wrap(
        model,
        embed=lambda tok: {"src": F.pad(model.token_emb(tok)[:, :, None], (0, 0, 0, len(ls))), "i": tok * 0},
        blocks=model.depth_layers,
        head=lambda s: model.lm_head(model.out_norm(s["src"].sum(2))),  # attn-res's output: the sum of the sources
        view=lambda s: s["src"].sum(2),
        sublayers=tuple,
        mixing=lambda layer: layer.mix if layer is not None else {},
        design=f"attnres-{model.cfg.attn_res_mode.value}",
        max_seq_len=model.cfg.max_seq_len,
    )


def describe_block():
    """The Block AttnRes model of `tiny("block")` (depthlens causal examples/attnres_model.py:describe_block)."""
    return describe(tiny("block"))


# python examples/attnres_model.py OUT.safetensors [full|block]: train a few steps with attn-res, save
if __name__ == "__main__":
    import sys

    from safetensors.torch import save_model
    from tiny_llama import train

    torch.manual_seed(0)
    model = tiny(sys.argv[2] if len(sys.argv) > 2 else "full")
    print("losses", train(model, model.cfg.vocab_size, steps=5, lr=1e-2))
    save_model(model, sys.argv[1])

"""A user's Hyper-Connections LM built with lucidrains' `hyper-connections` (pip install hyper-connections==0.4.11).

Written as that package's README shows: `get_init_and_expand_reduce_stream_functions(n)`, one `HyperConnections`
around each sublayer (attention, MLP), the streams folded into the batch as ((B n), T, d), a sum over the streams at
the end. Nothing here knows depthlens.
"""

from __future__ import annotations

from collections import defaultdict, deque

import torch
from einops import rearrange
from hyper_connections import get_init_and_expand_reduce_stream_functions
from tiny_llama import Attention, PreNorm, SwiGLU, train
from torch import nn

import depthlens


class HCBlock(nn.Module):
    def __init__(self, d: int, n_head: int, d_ff: int, layer: int, init_hc):
        super().__init__()
        self.attn = init_hc(dim=d, branch=PreNorm(d, Attention(d, n_head)), layer_index=2 * layer)
        self.mlp = init_hc(dim=d, branch=PreNorm(d, SwiGLU(d, d_ff)), layer_index=2 * layer + 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # ((B n), T, d) -> ((B n), T, d)
        return self.mlp(self.attn(h))


class HCModel(nn.Module):
    def __init__(
        self, vocab: int = 257, d: int = 32, n_layer: int = 4, n_head: int = 4, d_ff: int = 96, streams: int = 4
    ):
        super().__init__()
        self.streams = streams
        init_hc, self.expand, self.reduce = get_init_and_expand_reduce_stream_functions(streams)
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(HCBlock(d, n_head, d_ff, layer, init_hc) for layer in range(n_layer))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.expand(self.embed(tokens))
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.norm(self.reduce(h)))


# --- the adapter: what depthlens needs to know about this model (docs/own-model.md#worked-adapters) ----------


def describe(model: HCModel | None = None):
    """depthlens's view of `model`: state X (B, T, n, d); a block is one layer; its writers are the two branches."""
    model = HCModel() if model is None else model  # the CLI calls describe() and loads --weights into it
    n, seen = model.streams, defaultdict(lambda: deque(maxlen=2))  # each router's last two tanh outputs
    for block in model.blocks:  # lucidrains folds the n streams into the batch; depthlens keeps them apart
        block.register_forward_pre_hook(lambda m, args: (rearrange(args[0], "b t s d -> (b s) t d"),))
        block.register_forward_hook(lambda m, args, out: rearrange(out, "(b s) t d -> b t s d", s=n))
        for hc in (block.attn, block.mlp):  # each router's tanh runs on its alpha, then its beta logits: keep both
            hc.act.register_forward_hook(lambda m, args, out, hc=hc: seen[hc].append(out))

    def maps(hc):  # the package's own maps of its last call: A_m, B, A_r as [dest, source]
        alpha = seen[hc][0][:, :, 0] * hc.dynamic_alpha_scale + hc.static_alpha  # (B, T, n, n + 1)
        beta = seen[hc][1][:, :, 0] * hc.dynamic_beta_scale + hc.static_beta  # (B, T, n)
        return {"pre": alpha[..., 0], "post": beta, "res_map": alpha[..., 1:].transpose(-1, -2)}

    return depthlens.wrap(
        model,
        embed=lambda tokens: model.embed(tokens)[:, :, None].repeat(1, 1, n, 1),
        blocks=model.blocks,
        head=lambda x: model.lm_head(model.norm(x.sum(2))),
        view=lambda x: x.sum(2),
        sublayers=lambda block: (block.attn.branch, block.mlp.branch),
        mixing=lambda block: [maps(block.attn), maps(block.mlp)] if block is not None else {},
        design="hc-lucidrains",
    )


# python examples/hc_model.py OUT.safetensors: train a few steps with hyper-connections, save
if __name__ == "__main__":
    import sys

    from safetensors.torch import save_model

    torch.manual_seed(0)
    model = HCModel()
    print("losses", train(model, model.embed.num_embeddings, steps=5, lr=1e-2))
    save_model(model, sys.argv[1])

"""A user's Hyper-Connections LM built with lucidrains' `hyper-connections` (pip install hyper-connections==0.4.11).

Written as that package's README shows: `get_init_and_expand_reduce_stream_functions(n)`, one `HyperConnections`
around each sublayer (attention, MLP), the streams folded into the batch as ((B n), T, d), a sum over the streams at
the end. Nothing here knows depthlens.
"""

from __future__ import annotations

import torch
from hyper_connections import get_init_and_expand_reduce_stream_functions
from torch import nn

from examples.tiny_llama import Attention, PreNorm, SwiGLU


class HCBlock(nn.Module):
    def __init__(self, d: int, n_head: int, d_ff: int, layer: int, init_hc):
        super().__init__()
        self.attn = init_hc(dim=d, branch=PreNorm(d, Attention(d, n_head)), layer_index=2 * layer)
        self.mlp = init_hc(dim=d, branch=PreNorm(d, SwiGLU(d, d_ff)), layer_index=2 * layer + 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # ((B n), T, d) -> ((B n), T, d)
        return self.mlp(self.attn(h))


class HCModel(nn.Module):
    def __init__(
        self, vocab: int = 97, d: int = 32, n_layer: int = 4, n_head: int = 4, d_ff: int = 96, streams: int = 4
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

"""A user's nanoGPT (Karpathy's model.py, trimmed): GPT-2 layout, learned positions, Pre-LN blocks with
ln_1/attn/ln_2/mlp, exact GELU, the LM head tied to the token embedding. Nothing here knows depthlens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import depthlens


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab_size: int = 257, block_size: int = 64, n_layer: int = 4, n_head: int = 4, n_embd: int = 32
    ):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(n_embd),
            )
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --- the adapter: what depthlens needs to know about this model (docs/own-model.md#worked-adapters) ----------


def describe(gpt: GPT | None = None):
    """depthlens's view of `gpt`: one residual stream h (B, T, d); a block is `transformer.h[l]`."""
    gpt = GPT() if gpt is None else gpt  # the CLI calls describe() and loads --weights into it
    t = gpt.transformer
    return depthlens.wrap(
        gpt,
        embed=lambda idx: t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device)),
        blocks=t.h,
        head=lambda h: gpt.lm_head(t.ln_f(h)),
        sublayers=lambda block: (block.attn, block.mlp),
        design="nanogpt",
        max_seq_len=t.wpe.num_embeddings,
    )


# python examples/nanogpt_model.py OUT.safetensors: train a few steps with nanoGPT's forward, save
if __name__ == "__main__":
    import sys

    from safetensors.torch import save_model
    from tiny_llama import train

    torch.manual_seed(0)
    model = GPT()
    print("losses", train(model, model.lm_head.out_features, steps=5, lr=1e-2))
    save_model(model, sys.argv[1])

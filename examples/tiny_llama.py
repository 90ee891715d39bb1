"""The sublayers a user's LLaMA-style model is made of (plain PyTorch): pre-norm causal attention with RoPE, and a
pre-norm SwiGLU. The HC and mHC examples wrap them in their residual designs; nothing here knows depthlens.

Each sublayer is `PreNorm(body)`: y = body(RMSNorm(x)), so the design decides what x is and where y goes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoPE on (B, H, T, dh), the rotate-half layout of Hugging Face LLaMA."""
    dh, T = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (torch.arange(0, dh, 2, device=x.device).float() / dh)
    ang = torch.outer(torch.arange(T, device=x.device).float(), inv)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, d))


class SwiGLU(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, d_ff, bias=False), nn.Linear(d, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class PreNorm(nn.Module):
    def __init__(self, d: int, fn: nn.Module, eps: float = 1e-6):
        super().__init__()
        self.norm, self.fn = nn.RMSNorm(d, eps=eps), fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


def train(model: nn.Module, vocab: int, steps: int = 5, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """A few AdamW steps of next-token prediction on random tokens (enough to move every weight off its init)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        tok = torch.randint(0, vocab, (4, 17), generator=g)
        out = model(tok[:, :-1])
        logits = out[0] if isinstance(out, tuple) else out
        loss = F.cross_entropy(logits.flatten(0, 1), tok[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses

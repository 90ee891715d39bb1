"""The LLaMA-like backbone shared by all ten designs: RMSNorm, RoPE, attention (MHA/GQA), SwiGLU.

Module and parameter names follow Hugging Face LLaMA (q_proj, gate_proj, ...) so that the weight-key map
to `LlamaForCausalLM` stays a short explicit table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    """gamma * x / sqrt(mean(x^2) + eps), computed in fp32 and cast back (as HF LlamaRMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMS normalisation in fp32 (the AttnRes key norm, the mHC flattened-stream norm)."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF convention: split the head dim in halves (x1, x2) -> (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(cfg: ModelConfig, seq_len: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (T, head_dim) in fp32, HF `rotate_half` layout."""
    dh = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.int64, device=device).float() / dh))
    t = torch.arange(seq_len, device=device, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)  # (T, dh/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, dh)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, dh); cos/sin: (T, dh)."""
    return (x * cos.to(x.dtype)) + (rotate_half(x) * sin.to(x.dtype))


class Attention(nn.Module):
    """Causal multi-head attention with grouped KV heads (KV head of query head h is h // G, as HF)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        d = cfg.d_model
        self.q_proj = nn.Linear(d, self.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, d, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Un-rotated q (B, Hq, T, dh), k and v (B, Hkv, T, dh)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        return q, k, v

    def merge(self, o: torch.Tensor) -> torch.Tensor:
        """(B, Hq, T, dh) -> (B, T, d) through W_o."""
        B, _, T, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # (B, T, d)
        q, k, v = self.project(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        return self.merge(o)


class MLP(nn.Module):
    """SwiGLU: W_2(silu(x W_1) * x W_3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.ffn_dim
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor, *_: object) -> torch.Tensor:  # (B, T, d)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Sublayer(nn.Module):
    """The *body* of one sublayer: pre-norm N_j, the function F_j, and (Sandwich only) a post-norm.

    The residual design's router decides what goes in (x) and what happens to the output; the body
    only computes y = [N_post](F_j(N_j(x) * in_scale)). Everything here moves with a `body` swap.
    """

    def __init__(self, cfg: ModelConfig, kind: str, post_norm: bool = False):
        super().__init__()
        self.kind = kind  # "attn" | "mlp"
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.fn = Attention(cfg) if kind == "attn" else MLP(cfg)
        self.post_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if post_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                in_scale: float | None = None, prenorm: bool = True) -> torch.Tensor:
        h = self.norm(x) if prenorm else x
        if in_scale is not None:
            h = h * in_scale
        y = self.fn(h, cos, sin)
        return self.post_norm(y) if self.post_norm is not None else y

"""The LLaMA-like backbone shared by all ten designs: RMSNorm, RoPE, attention (MHA/GQA), SwiGLU.

Module and parameter names follow Hugging Face LLaMA (q_proj, gate_proj, ...) so that the weight-key map
to `LlamaForCausalLM` stays a short explicit table.

TransformerLens hook points inside a sublayer (names, shapes and meaning as TransformerLens; docs/hooks.md):
the attention body fires `hook_q` (B, T, H, dh), `hook_k`/`hook_v` (B, T, H_kv, dh), `hook_rot_q`/`hook_rot_k`
(after RoPE), `hook_attn_scores`/`hook_pattern` (B, H, T_q, T_k) and `hook_z` (B, T, H, dh); the SwiGLU fires
`hook_pre` (gate pre-activation), `hook_pre_linear` (up projection) and `hook_post` (B, T, d_mlp); a norm fires
`hook_scale` (B, T, 1) and `hook_normalized` (B, T, d). The hook points are identity modules, so an unhooked
forward is bit-identical to one without them. The two that cost work (scale, scores/pattern: the fused
attention kernel never forms the T x T matrix) are computed only while a hook is attached to them, and the
forward consumes them only when a hook changed them (`side_hook`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .hook_contract import fire
from .lens_root import hook_point


def hooked(hook: nn.Module) -> bool:
    """Whether any TransformerLens hook (forward or backward) is attached to `hook`."""
    return bool(hook.fwd_hooks or hook.bwd_hooks)


def side_hook(hook: nn.Module, value: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Fire `hook` on a value the forward computed for the hook alone (not on its own path).

    Returns (value after the hook, changed). `changed` is True when a hook edited it (in place or by returning a
    new tensor) or when a backward hook is attached (the gradient must flow through it): only then does the
    caller recompute the forward from it, so an observing hook leaves the forward bit-identical.
    """
    if not hooked(hook):
        return value, False
    if hook.bwd_hooks:
        return fire(hook, value), True
    before = value.detach().clone()
    after = fire(hook, value)
    return after, not torch.equal(after, before)  # did the hook edit this very tensor: exact on purpose


class NormHooks(nn.Module):
    """TransformerLens hook points of one norm site (`blocks.{i}.ln1`, `ln2`, `ln_final`, ...); no weights.

    hook_scale (..., 1): sqrt(mean(x^2) + eps) in fp32, computed only while hooked (an edit divides by it);
    hook_normalized (..., d): x / scale before the gain, as TransformerLens' RMSNorm.
    The norm it observes lives elsewhere (a body's `norm`, the model's final `norm`), so checkpoint keys do not
    change; `norm`, when given, makes the site callable (`model.ln_final(x)`, which TransformerLens' logit
    lens calls).
    """

    _norm: RMSNorm | None  # kept in __dict__ (see __init__): declared for the type checker only

    def __init__(self, norm: RMSNorm | None = None):
        super().__init__()
        self.hook_scale = hook_point()
        self.hook_normalized = hook_point()
        self.__dict__["_norm"] = norm  # not a submodule: its weight stays saved once, under its own name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._norm is None:
            raise TypeError("this norm site only carries hook points; the norm is the body's own")
        return self._norm(x, hooks=self)


class RMSNorm(nn.Module):
    """gamma * x / sqrt(mean(x^2) + eps), computed in fp32 and cast back (as HF LlamaRMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, hooks: NormHooks | None = None) -> torch.Tensor:  # (..., d) -> (..., d)
        dtype = x.dtype
        x32 = x.float()
        ms = x32.pow(2).mean(-1, keepdim=True) + self.eps  # (..., 1)
        if hooks is None:
            return self.weight * (x32 * torch.rsqrt(ms)).to(dtype)
        scale, edited = side_hook(hooks.hook_scale, ms.sqrt()) if hooked(hooks.hook_scale) else (ms, False)
        normed = (x32 / scale if edited else x32 * torch.rsqrt(ms)).to(dtype)
        return self.weight * fire(hooks.hook_normalized, normed)


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

    def project(
        self, x: torch.Tensor, hooks: Sublayer | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Un-rotated q (B, Hq, T, dh), k and v (B, Hkv, T, dh); hooks fire in TransformerLens' (B, T, H, dh)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        if hooks is not None:
            q, k, v = fire(hooks.hook_q, q), fire(hooks.hook_k, k), fire(hooks.hook_v, v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hooks: Sublayer | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE on q (B, Hq, T, dh) and k (B, Hkv, T, dh); hook_rot_q/k fire in (B, T, H, dh) (views: no copy)."""
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if hooks is not None:
            q = fire(hooks.hook_rot_q, q.transpose(1, 2)).transpose(1, 2)
            k = fire(hooks.hook_rot_k, k.transpose(1, 2)).transpose(1, 2)
        return q, k

    def merge(self, o: torch.Tensor, hooks: Sublayer | None = None) -> torch.Tensor:
        """(B, Hq, T, dh) -> (B, T, d) through W_o; hook_z fires on the heads' outputs z (B, T, Hq, dh)."""
        B, _, T, _ = o.shape
        z = o.transpose(1, 2)
        if hooks is not None:
            z = fire(hooks.hook_z, z)
        return self.o_proj(z.reshape(B, T, self.n_head * self.head_dim))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hooks: Sublayer | None = None
    ) -> torch.Tensor:  # (B, T, d)
        q, k, v = self.project(x, hooks)
        q, k = self.rotate(q, k, cos, sin, hooks)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        if hooks is not None and (hooked(hooks.hook_attn_scores) or hooked(hooks.hook_pattern)):
            o = self.hooked_pattern(q, k, v, o, hooks)
        return self.merge(o, hooks)

    def hooked_pattern(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, hooks: Sublayer
    ) -> torch.Tensor:
        """Form the pattern the fused kernel computed, fire hook_attn_scores and hook_pattern, and return o, or
        the attention recomputed from an edited score or pattern matrix.

        scores = q k^T / sqrt(dh) with -inf above the diagonal, (B, Hq, T, T) fp32; query head h reads KV head
        h // G; pattern = softmax(scores) over keys.
        """
        G = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, Hq, T, dh)
        T = q.shape[2]
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores, new_scores = side_hook(hooks.hook_attn_scores, scores.masked_fill(~causal, float("-inf")))
        pattern, new_pattern = side_hook(hooks.hook_pattern, scores.softmax(-1))
        if not (new_scores or new_pattern):
            return o
        return pattern.to(v.dtype) @ v


class MLP(nn.Module):
    """SwiGLU: W_2(silu(x W_1) * x W_3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.ffn_dim
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor, *_: object, hooks: Sublayer | None = None) -> torch.Tensor:  # (B, T, d)
        if hooks is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        pre = fire(hooks.hook_pre, self.gate_proj(x))  # (B, T, d_mlp)
        post = fire(hooks.hook_post, F.silu(pre) * fire(hooks.hook_pre_linear, self.up_proj(x)))  # (B, T, d_mlp)
        return self.down_proj(post)


class Sublayer(nn.Module):
    """The *body* of one sublayer: pre-norm N_j, the function F_j, and (Sandwich only) a post-norm.

    The residual design's router decides what goes in (x) and what happens to the output; the body
    only computes y = [N_post](F_j(N_j(x) * in_scale)). Everything here moves with a `body` swap, except the
    hook points: the block at a layer *position* passes its own (`hooks`, the position's sublayer; `ln`,
    `ln_post`, its norm sites), so `blocks.3.attn.hook_pattern` is whatever runs at position 3.
    """

    # the hook points set in __init__ (ATTN_HOOKS or MLP_HOOKS, by kind): declared for the type checker only
    hook_q: nn.Module
    hook_k: nn.Module
    hook_v: nn.Module
    hook_rot_q: nn.Module
    hook_rot_k: nn.Module
    hook_attn_scores: nn.Module
    hook_pattern: nn.Module
    hook_z: nn.Module
    hook_pre: nn.Module
    hook_pre_linear: nn.Module
    hook_post: nn.Module

    def __init__(self, cfg: ModelConfig, kind: str, post_norm: bool = False):
        super().__init__()
        self.kind = kind  # "attn" | "mlp"
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.fn = Attention(cfg) if kind == "attn" else MLP(cfg)
        self.post_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if post_norm else None
        names = ATTN_HOOKS if kind == "attn" else MLP_HOOKS
        for name in names:
            setattr(self, name, hook_point())

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        in_scale: float | None = None,
        prenorm: bool = True,
        hooks: Sublayer | None = None,
        ln: NormHooks | None = None,
        ln_post: NormHooks | None = None,
    ) -> torch.Tensor:
        h = self.norm(x, ln) if prenorm else x
        if in_scale is not None:
            h = h * in_scale
        y = self.fn(h, cos, sin, hooks=hooks if hooks is not None else self)
        return self.post_norm(y, ln_post) if self.post_norm is not None else y


# TransformerLens hook points of the bodies (attributes of `blocks.{i}.attn` / `blocks.{i}.mlp`)
ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_scores", "hook_pattern", "hook_z")
MLP_HOOKS = ("hook_pre", "hook_pre_linear", "hook_post")

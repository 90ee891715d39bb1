"""MoDA, Mixture-of-Depths Attention (Zhu et al., arXiv 2603.15619), pre-norm variant (docs/designs.md#moda).

The residual stream is plain Pre-LN; what changes is attention. Each query head runs ONE softmax over the
causal sequence keys of its layer AND the depth slots of the same token written by earlier layers:

    x^ = N_l1(h);  q, k_l, v_l = x^ W_q, x^ W_k, x^ W_v               (q, k rotated for the sequence part)
    D_l(t) = {(k_i(t), v_i(t)), (k^F_i(t), v^F_i(t)) : i < l}         2l slots, order [attn_0, mlp_0, ...]
    a = softmax([q_t . k_l(s) / sqrt(d_h)]_{s <= t}  (+)  [q_t . K / sqrt(d_h)]_{K in D_l(t)})
    o_t = sum_s a_s v_l(s) + sum_slot a_slot V_slot;    u = h + o W_o
    x~ = N_l2(u);  k^F_l = x~ W^K_F, v^F_l = x~ W^V_F;    h' = u + MLP(x~)

GQA follows HF: query head h reads KV head h // G. Depth logits, `cfg.moda_depth_rope` (docs/concepts.md#inferences):

* "unrotated" (default): un-rotated q against un-rotated depth keys (attention k and k^F alike);
* "rotate_ffn": rotated q against rotated keys, k^F rotated at its own position t (RoPE_t(q) . RoPE_t(k) =
  q . k, so this equals "unrotated" for attention slots and differs only in how k^F is treated);
* "prerope_keys": the official recipe: depth keys are stored BEFORE RoPE (attention k and k^F) and read
  by the rotated query RoPE_t(q), so every depth logit depends on the position t. The depth KV live in the state, so a skip can invalidate them: keep = 0 gives h' = h AND marks
that sublayer's depth slot invalid on those tokens.

The attention body computes the joint softmax explicitly (O(T^2) logits per head), which is what the
analysis needs (per-slot masses); it is not a fused kernel.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from einops import einsum, rearrange
from torch import nn

from ..backbone import Attention, NormHooks, Sublayer, apply_rope, hooked, side_hook
from ..config import ModelConfig
from ..readouts import sublayer_label
from .base import Design, Router, State, SublayerCall, apply_keep

DepthKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # dk, dv (B, T, S, H_kv, d_h); dvalid (B, T, S)


def depth_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_depth: torch.Tensor,
    depth: DepthKV | None,
    hooks: Sublayer | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One softmax over causal sequence keys and the same token's valid depth slots.

    q (B, Hq, T, e) and k, v (B, Hkv, T, e) for the sequence part; q_depth (B, Hq, T, e) the query used
    against the depth keys (q itself, or the un-rotated q). Scale 1/sqrt(e) for both parts; logits and
    softmax in fp32. Returns o (B, Hq, T, e) and the pieces: a_seq (B, Hq, T, T), a_depth (B, Hq, T, S),
    o_seq and o_depth (B, Hq, T, e).

    hooks: the sequence part in TransformerLens' names, hook_attn_scores = the masked sequence logits and
    hook_pattern = a_seq (B, Hq, T, T), whose rows sum to 1 - depth mass. An edit to either is what the rest
    of the softmax and the output then use (the depth logits stay); unhooked, nothing is recomputed.
    """
    B, Hq, T, e = q.shape
    G = Hq // k.shape[1]
    if depth is None:
        depth = (
            k.new_zeros(B, T, 0, k.shape[1], e),
            v.new_zeros(B, T, 0, k.shape[1], e),
            torch.zeros(B, T, 0, dtype=torch.bool, device=q.device),
        )
    dk, dv, dvalid = depth
    scale = 1.0 / math.sqrt(e)
    qg = rearrange(q, "b (h g) t e -> b h g t e", g=G)  # query head h*G+g reads KV head h
    qdg = rearrange(q_depth, "b (h g) t e -> b h g t e", g=G)
    seq = einsum(qg, k, "b h g t e, b h s e -> b h g t s").float() * scale  # (B, Hkv, G, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    seq = seq.masked_fill(~causal, float("-inf"))
    dep = einsum(qdg, dk, "b h g t e, b t s h e -> b h g t s").float() * scale  # (B, Hkv, G, T, S)
    dep = dep.masked_fill(~rearrange(dvalid, "b t s -> b 1 1 t s"), float("-inf"))
    heads = lambda x: rearrange(x, "b h g t x -> b (h g) t x")  # noqa: E731
    groups = lambda x: rearrange(x, "b (h g) t x -> b h g t x", g=G)  # noqa: E731
    if hooks is not None and hooked(hooks.hook_attn_scores):
        scores, edited = side_hook(hooks.hook_attn_scores, heads(seq))
        seq = groups(scores) if edited else seq
    a = torch.cat([seq, dep], -1).softmax(-1)  # (B, Hkv, G, T, T + S): causal column 0 keeps it finite
    a_seq, a_dep = a[..., :T], a[..., T:]
    if hooks is not None and hooked(hooks.hook_pattern):
        pattern, edited = side_hook(hooks.hook_pattern, heads(a_seq))
        a_seq = groups(pattern) if edited else a_seq
    o_seq = einsum(a_seq.to(v.dtype), v, "b h g t s, b h s e -> b h g t e")
    o_dep = einsum(a_dep.to(dv.dtype), dv, "b h g t s, b t s h e -> b h g t e")
    return heads(o_seq + o_dep), {
        "a_seq": heads(a_seq),
        "a_depth": heads(a_dep),
        "o_seq": heads(o_seq),
        "o_depth": heads(o_dep),
    }


class MoDAAttentionBody(Sublayer):
    """Pre-norm + depth-aware attention. Reads the depth set, returns y and (via `out`) its own K/V slot.

    out (filled when given): "k", "v" (B, T, H_kv, e) the slot this layer appends (un-rotated, or rotated
    under "rotate_ffn"), and the attention pieces of `depth_attention` for readouts.
    """

    fn: Attention  # Sublayer(kind="attn") builds one: declared for the type checker only

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, "attn")
        self.depth_rope = cfg.moda_depth_rope

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        depth: DepthKV | None = None,
        out: dict[str, Any] | None = None,
        hooks: Sublayer | None = None,
        ln: NormHooks | None = None,
        **_: Any,
    ) -> torch.Tensor:
        hooks = hooks if hooks is not None else self
        q, k, v = self.fn.project(self.norm(x, ln), hooks)  # un-rotated (B, Hq, T, e), (B, Hkv, T, e)
        qr, kr = self.fn.rotate(q, k, cos, sin, hooks)
        qd, kd = {"unrotated": (q, k), "rotate_ffn": (qr, kr), "prerope_keys": (qr, k)}[self.depth_rope]
        o, parts = depth_attention(qr, kr, v, qd, depth, hooks)
        if out is not None:
            out.update(parts, k=rearrange(kd, "b h t e -> b t h e"), v=rearrange(v, "b h t e -> b t h e"))
        return self.fn.merge(o, hooks)


class MoDAMLPBody(Sublayer):
    """Pre-norm + SwiGLU, plus the FFN depth-KV projections applied to the normalised FFN input x~.

    `depth_k_proj`, `depth_v_proj`: d -> H_kv * d_h, bias-free, normal(0, init_std). They are design
    overhead (the `.depth_` prefix), and move with the body under swaps.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, "mlp")
        self.n_kv_head, self.rotate_depth = cfg.kv_heads, cfg.moda_depth_rope == "rotate_ffn"
        self.depth_k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.depth_v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        for lin in (self.depth_k_proj, self.depth_v_proj):
            nn.init.normal_(lin.weight, std=cfg.init_std)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        depth: DepthKV | None = None,
        out: dict[str, Any] | None = None,
        hooks: Sublayer | None = None,
        ln: NormHooks | None = None,
        **_: Any,
    ) -> torch.Tensor:
        xn = self.norm(x, ln)  # x~ = N_l2(u)
        if out is not None:  # the MLP only writes depth KV; `depth` is accepted for a uniform call
            kf = rearrange(self.depth_k_proj(xn), "b t (h e) -> b h t e", h=self.n_kv_head)
            if self.rotate_depth:
                kf = apply_rope(kf, cos, sin)
            out.update(
                k=rearrange(kf, "b h t e -> b t h e"),
                v=rearrange(self.depth_v_proj(xn), "b t (h e) -> b t h e", h=self.n_kv_head),
            )
        return self.fn(xn, hooks=hooks if hooks is not None else self)


class MoDARouter(Router):
    """h_j = h_{j-1} + keep * F_j(...), then append the sublayer's depth slot (invalid where skipped)."""

    def forward(self, state: State, call: SublayerCall) -> tuple[State, torch.Tensor]:
        branch, j, ctx, keep, carry = call.branch, call.j, call.ctx, call.keep, call.carry
        h, dk, dv, dvalid = state["h"], state["dk"], state["dv"], state["dvalid"]
        out: dict[str, Any] = {}
        y = apply_keep(branch(h, depth=(dk, dv, dvalid), out=out), keep)  # (B, T, d)
        ok = torch.ones_like(h[..., :1], dtype=torch.bool) if keep is None else (keep != 0)[..., None]  # (B, T, 1)
        if ctx.record is not None and "a_depth" in out:
            _put_depth_readouts(ctx, j, out, dk.shape[2])
        state = {
            "h": h + y,
            "dk": torch.cat([dk, out["k"][:, :, None]], 2),
            "dv": torch.cat([dv, out["v"][:, :, None]], 2),
            "dvalid": torch.cat([dvalid, ok], 2),
        }
        return state, y if carry is None else carry + y  # u_l = h_{l+1} - h_l


def _put_depth_readouts(ctx, j: int, out: dict[str, torch.Tensor], n_slots: int) -> None:
    """Per query head: depth mass, per-slot mass, sink mass (sequence position 0), output split."""
    bth = lambda x: rearrange(x, "b h t -> b t h")  # noqa: E731
    ctx.put("depth_mass", bth(out["a_depth"].sum(-1)), sublayer=j)  # (B, T, H)
    ctx.put("slot_mass", rearrange(out["a_depth"], "b h t s -> b t h s"), sublayer=j)  # (B, T, H, S)
    ctx.put("sink_mass", bth(out["a_seq"][..., 0]), sublayer=j)  # (B, T, H)
    ctx.put("slot_labels", [sublayer_label(s) for s in range(n_slots)], sublayer=j)  # slot s = sublayer s's K/V
    ctx.put("o_seq_norm", bth(out["o_seq"].float().norm(dim=-1)), sublayer=j)  # (B, T, H)
    ctx.put("o_depth_norm", bth(out["o_depth"].float().norm(dim=-1)), sublayer=j)


class MoDA(Design):
    """Pre-LN residual h plus a per-token depth-KV cache written by every sublayer.

    State: "h" (B, T, d); "dk", "dv" (B, T, S, H_kv, d_h) with S = 2 per finished layer, in the order
    [attn_0, mlp_0, attn_1, mlp_1, ...]; "dvalid" (B, T, S) bool. Not a residual mix: `depth_mixing`
    is None, the readouts are depth-attention masses.
    """

    slug = "moda"
    view_name = "residual stream h (the depth KV cache is state['dk'], state['dv'])"

    def make_router(self, j: int) -> Router:
        return MoDARouter()

    def make_sublayer(self, kind: str) -> Sublayer:
        return MoDAAttentionBody(self.cfg) if kind == "attn" else MoDAMLPBody(self.cfg)

    def init_state(self, h0: torch.Tensor) -> State:
        B, T, _ = h0.shape
        empty = h0.new_zeros(B, T, 0, self.cfg.kv_heads, self.cfg.head_dim)
        return {
            "h": h0,
            "dk": empty,
            "dv": empty.clone(),
            "dvalid": torch.zeros(B, T, 0, dtype=torch.bool, device=h0.device),
        }

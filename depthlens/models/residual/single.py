"""Single-stream designs: Pre-LN, LNS, Sandwich-LN (identity trunk) and DeepNorm, KEEL (post-norm trunk).

All five carry one residual tensor h (B, T, d). They differ in where the norms sit and how skip and branch
are scaled (docs/designs.md#single-stream). Every sublayer is written as

    x_j = (a_j * x_{j-1} + F_j(.)) / r_j        (r_j = 1 without a trunk norm, gain gamma ignored)

so one depth-mixing readout serves all five: the weight of source i in x_j is
(1/r_i) * prod_{k=i+1..j} a_k / r_k, per token.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..backbone import RMSNorm
from ..readouts import readout_key
from .base import Design, Router, State, SublayerCall, apply_keep


class AdditiveRouter(Router):
    """h_j = h_{j-1} + F_j(N_j(h_{j-1}) * in_scale). Pre-LN (scale 1), LNS (1/sqrt(l)), Sandwich (body post-norm)."""

    def __init__(self, in_scale: float | None = None):
        super().__init__()
        self.in_scale = in_scale  # LNS: 1/sqrt(layer index, 1-based) of the router's home layer

    def forward(self, state: State, call: SublayerCall) -> tuple[State, torch.Tensor]:
        branch, j, ctx, keep, carry = call.branch, call.j, call.ctx, call.keep, call.carry
        h = state["h"]
        y = apply_keep(branch(h, in_scale=self.in_scale), keep)  # (B, T, d)
        ctx.put("skip_gain", 1.0, sublayer=j)
        return {**state, "h": h + y}, y if carry is None else carry + y

    def readout(self) -> dict[str, Any]:
        return {"in_scale": 1.0 if self.in_scale is None else self.in_scale}


class PostNormRouter(Router):
    """x_j = N_out(alpha * x_{j-1} + F_j(N_in(x_{j-1}))), add and norm in fp32 (DeepNorm, KEEL).

    DeepNorm has no branch pre-norm and reuses the body's norm as the trunk norm; KEEL keeps the branch
    pre-norm and owns an extra trunk norm. A skipped token keeps its input (Csordas' merge_io).
    """

    def __init__(self, alpha: float, trunk_norm: RMSNorm | None, branch_prenorm: bool):
        super().__init__()
        self.alpha = alpha
        self.trunk_norm = trunk_norm  # None: use the body's own norm (DeepNorm)
        self.branch_prenorm = branch_prenorm

    def forward(self, state: State, call: SublayerCall) -> tuple[State, torch.Tensor]:
        branch, sub, j, ctx, keep, carry = call.branch, call.sub, call.j, call.ctx, call.keep, call.carry
        h = state["h"]
        y = branch(h, prenorm=self.branch_prenorm)
        norm: RMSNorm = self.trunk_norm if self.trunk_norm is not None else sub.norm  # type: ignore[assignment]
        z = self.alpha * h.float() + y.float()  # fp32: alpha*x swamps F in bf16 (docs/designs.md#single-stream)
        r = torch.sqrt(z.pow(2).mean(-1) + norm.eps)  # (B, T) the trunk RMS r_j
        out = norm(z).to(h.dtype)
        if keep is not None:
            out = torch.where(keep.bool()[..., None], out, h)
        ctx.put("skip_gain", self.alpha, sublayer=j)
        ctx.put("rms", r, sublayer=j)
        ctx.put(
            "branch_share", y.float().norm(dim=-1) / (self.alpha * h.float().norm(dim=-1)).clamp_min(1e-12), sublayer=j
        )
        u = out - h
        return {**state, "h": out}, u if carry is None else carry + u

    def readout(self) -> dict[str, Any]:
        return {"alpha": self.alpha}


class SingleStreamDesign(Design):
    """Shared readouts of the single-stream family."""

    def depth_mixing(self, record: dict[str, Any], n_sub: int) -> torch.Tensor:
        ref = record["h0"]  # (B, T, d)
        B, T = ref.shape[:2]
        ones = torch.ones(B, T, dtype=torch.float64, device=ref.device)
        a = [
            torch.as_tensor(float(record[readout_key("skip_gain", k)]), dtype=torch.float64) * ones
            for k in range(n_sub)
        ]
        r = [record[readout_key("rms", k)].double() if readout_key("rms", k) in record else ones for k in range(n_sub)]
        M = torch.zeros(B, T, n_sub + 1, n_sub + 1, dtype=torch.float64, device=ref.device)
        # M[..., i, j] = weight of source i in x_j (the input of 0-based sublayer j; j = n_sub: final).
        for j in range(n_sub + 1):
            coef = ones.clone()  # running product over k = i+1..j, built from the right
            for i in range(j, -1, -1):
                if i == 0:
                    M[..., 0, j] = coef
                else:
                    M[..., i, j] = coef / r[i - 1]
                    coef = coef * a[i - 1] / r[i - 1]
        return M


class PreLN(SingleStreamDesign):
    slug = "preln"

    def make_router(self, j: int) -> Router:
        return AdditiveRouter()


class LNS(SingleStreamDesign):
    """LayerNorm Scaling: the branch pre-norm output is scaled by 1/sqrt(l), l the 1-based LAYER index."""

    slug = "lns"

    def make_router(self, j: int) -> Router:
        return AdditiveRouter(in_scale=1.0 / math.sqrt(j // 2 + 1))


class Sandwich(SingleStreamDesign):
    """h_j = h_{j-1} + N_post(F_j(N_pre(h_{j-1}))): the post-norm lives in the body."""

    slug = "sandwich"

    def make_router(self, j: int) -> Router:
        return AdditiveRouter()

    def post_norm_on_branch(self) -> bool:
        return True


class DeepNorm(SingleStreamDesign):
    """h_j = N_j(alpha h_{j-1} + F_j(h_{j-1})), alpha = (2L)^(1/4); init gain beta = (8L)^(-1/4)."""

    slug = "deepnorm"
    branch_prenorm = False  # the body's norm is the trunk norm, applied by the router
    norm_reads_view = False

    def make_router(self, j: int) -> Router:
        assert self.cfg.deepnorm_alpha is not None  # ModelConfig fills it from L
        return PostNormRouter(self.cfg.deepnorm_alpha, trunk_norm=None, branch_prenorm=False)

    def init_weights(self, model: nn.Module) -> None:
        # DeepNet paper: xavier_normal_(gain=beta) for FFN, W_v, W_o; gain 1 for W_q, W_k.
        beta = self.cfg.deepnorm_beta
        assert beta is not None  # ModelConfig fills it from L
        blocks: Any = model.blocks  # a DepthModel's Blocks (nn.Module types the attribute Tensor | Module)
        for blk in blocks:
            att, mlp = blk.attn.fn, blk.mlp.fn
            for lin in (att.q_proj, att.k_proj):
                nn.init.xavier_normal_(lin.weight, gain=1.0)
            for lin in (att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                nn.init.xavier_normal_(lin.weight, gain=beta)


class KEEL(SingleStreamDesign):
    """Post-LN with a Highway skip (alpha = 2L) and an extra branch pre-norm.

    Sublayer 0 (first attention) is pure Pre-LN; sublayer 1 (first MLP) keeps the trunk norm but no alpha.
    """

    slug = "keel"

    def make_router(self, j: int) -> Router:
        if j == 0:
            return AdditiveRouter()
        alpha = 1.0 if j == 1 else self.cfg.keel_alpha
        assert alpha is not None  # ModelConfig fills keel_alpha from L
        return PostNormRouter(alpha, trunk_norm=RMSNorm(self.cfg.d_model, self.cfg.norm_eps), branch_prenorm=True)

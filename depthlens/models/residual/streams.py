"""What HC and mHC share: n parallel residual streams and one stream-update rule.

State: {"x": X (B, T, n, d)}, row s of X[b, t] is stream s. Both designs are, per sublayer j (0-based),

    u_j     = pre_j · X_j                     = sum_s pre_j[s] X_j[s]          (branch input, 1 x d)
    y_j     = F_j(u_j)                        (the body: pre-norm + Attn/MLP)
    W_j     = post_j^T y_j                    (the write, n x d: stream i gets post_j[i] y_j)
    X_{j+1} = R_j X_j + W_j                   R_j: the residual map, COLUMN convention (row = destination)

with per-token maps pre_j (n), post_j (n), R_j (n x n) that each design computes from X_j in fp32 (at least):
HC: pre = A_m, post = B, R = A_r^T ; mHC: pre = H^pre, post = H^post, R = H^res (docs/designs.md#hc).
Expand: X_0 = [h_0; ...; h_0] (n copies). Collapse: h_L = c · X_{2L}, c = 1_n (sum) or 1_n / n (mean).

Interventions (docs/concepts.md#notation):
* skip (keep = 0) in mode "mix" (default): X_{j+1} = R_j X_j on the skipped tokens (keep the mixing, drop W_j);
  mode "identity": X_{j+1} = X_j there.
* the layer update u_l (the router `carry`, in stream space (B, T, n, d)) is
  u_l = R_{2l+1} W_{2l} + W_{2l+1}, i.e. X_{l+1} - R_{2l+1} R_{2l} X_l; it is 0 on skipped tokens.

Readouts: every router stores `sub{j}.res_map` = R_j (B, T, n, n) [dest, source] plus its own named maps;
`depth_mixing` composes them into M[i -> j] (docstring there).
"""

from __future__ import annotations

from typing import Any

import torch
from einops import einsum, repeat

from ..readouts import readout_key
from .base import Design, Router, State, SublayerCall, apply_keep

SKIP_MODES = ("mix", "identity")


def map_dtype(x: torch.Tensor) -> torch.dtype:
    """Mixing maps are computed in fp32, or in the state's dtype when that is wider (fp64 checks)."""
    return torch.promote_types(x.dtype, torch.float32)


class StreamRouter(Router):
    """One sublayer of a multi-stream design. Subclasses implement `maps`; the update rule lives here.

    `skip_mode` ("mix" | "identity") says what keep = 0 means; the design sets it from the config.
    """

    skip_mode: str = "mix"

    def maps(self, x: torch.Tensor, j: int, ctx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """X (B, T, n, d) -> pre (B, T, n), post (B, T, n), R (B, T, n, n) [dest, source], in map_dtype(x).

        Implementations record their own named readouts with ctx.put("<name>", value, sublayer=j).
        """
        raise NotImplementedError

    def forward(self, state: State, call: SublayerCall) -> tuple[State, torch.Tensor]:
        branch, j, ctx, keep, carry = call.branch, call.j, call.ctx, call.keep, call.carry
        x = state["x"]  # (B, T, n, d)
        pre, post, res = self.maps(x, j, ctx)
        ctx.put("res_map", res, sublayer=j)
        xm = x.to(pre.dtype)
        u = einsum(pre, xm, "b t n, b t n d -> b t d")  # width connection: the branch input
        y = branch(u.to(x.dtype))  # (B, T, d)
        w = apply_keep(einsum(post, y.to(pre.dtype), "b t n, b t d -> b t n d"), keep)  # the write W_j
        mixed = einsum(res, xm, "b t i k, b t k d -> b t i d")  # R_j X_j
        new = mixed + w
        if keep is not None and self.skip_mode == "identity":
            new = torch.where(keep.bool()[..., None, None], new, xm)
        # layer update: after attention u = W_attn; after MLP u = R_mlp u + W_mlp (docs/concepts.md#notation)
        upd = w if carry is None else einsum(res, carry.to(res.dtype), "b t i k, b t k d -> b t i d") + w
        return {**state, "x": new.to(x.dtype)}, upd.to(x.dtype)


class MultiStreamDesign(Design):
    """Base of HC and mHC: state {"x": (B, T, n, d)}, expand by replication, collapse by sum or mean.

    Subclasses set `pre_name` / `post_name`: the record keys of their pre and post maps (B, T, n).
    """

    editable_view = False
    view_name = "sum over the n streams"
    multi_stream = True
    norm_reads_view = False  # a branch normalises its width-connection input pre . X, not the stream sum
    pre_name = "pre"
    post_name = "post"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.n = cfg.hc_streams
        self.collapse = cfg.hc_collapse  # "sum" | "mean" (one config field for HC and mHC)
        self.final_reads_view = self.collapse == "sum"  # h_L is the stream sum only under the sum collapse
        self.skip_mode = getattr(cfg, "multistream_skip", "mix")
        if self.skip_mode not in SKIP_MODES:
            raise ValueError(f"multistream_skip must be one of {SKIP_MODES}, got {self.skip_mode!r}")

    def make_router(self, j: int) -> Router:
        router = self.build_router(j)
        router.skip_mode = self.skip_mode
        return router

    def build_router(self, j: int) -> StreamRouter:
        raise NotImplementedError

    # --- state --------------------------------------------------------------------------------------
    def init_state(self, h0: torch.Tensor) -> State:
        return {"x": repeat(h0, "b t d -> b t n d", n=self.n).contiguous()}  # X_0: n copies of h_0

    def view(self, state: State) -> torch.Tensor:
        return state["x"].sum(-2)  # (B, T, d)

    def set_view(self, state: State, value: torch.Tensor) -> State:
        raise RuntimeError(
            f"design {self.slug!r}: the residual view is the {self.view_name} and is read-only; "
            "edit hook_streams_* instead"
        )

    def streams(self, state: State) -> torch.Tensor:
        return state["x"]

    def set_streams(self, state: State, value: torch.Tensor) -> State:
        if value.shape != state["x"].shape:
            raise ValueError(f"streams must keep shape {tuple(state['x'].shape)}, got {tuple(value.shape)}")
        return {**state, "x": value}

    def collapse_vector(self, dtype=torch.float64, device=None) -> torch.Tensor:
        """c (n,): h_L = c · X_{2L}; ones for sum, 1/n for mean."""
        c = torch.ones(self.n, dtype=dtype, device=device)
        return c / self.n if self.collapse == "mean" else c

    def final(self, state: State, final_router, ctx) -> torch.Tensor:
        x = state["x"]
        return x.mean(-2) if self.collapse == "mean" else x.sum(-2)

    def update_norm_dims(self) -> int:
        return 2

    # --- readouts ------------------------------------------------------------------------------------
    def depth_mixing(self, record: dict[str, Any], n_sub: int) -> torch.Tensor:
        """M[b, t, i, j] (B, T, 2L+1, 2L+1), fp64: weight of source i in the input of 0-based sublayer j.

        Sources: i = 0 the embedding h_0, i >= 1 the output y_{i-1} of 0-based sublayer i-1. Destination
        j < 2L is the branch input u_j; j = 2L is the collapsed readout h_L. With the column convention
        X_{k+1} = R_k X_k + post_k^T y_k (R_k = `res_map`, row = destination):

            M[0 -> j] = pre_j · R_{j-1} ... R_0 1_n
            M[i -> j] = pre_j · R_{j-1} ... R_i post_{i-1}        (1 <= i <= j; mHC: H^pre_j H^res ... H^post^T)
            M[i -> j] = 0                                         (i > j)

        with pre_{2L} := c, the collapse vector. Computed forwards: the coefficient C[s] (n) of every source
        s inside X_k is carried through R_k in one batched product per sublayer.
        """
        res0 = record[readout_key("res_map", 0)]
        B, T, n = res0.shape[:3]
        f64 = dict(dtype=torch.float64, device=res0.device)
        C = torch.zeros(B, T, n_sub + 1, n, **f64)  # C[..., s, :]: coefficient of source s in X_k
        C[..., 0, :] = 1.0  # X_0 = 1_n h_0
        M = torch.zeros(B, T, n_sub + 1, n_sub + 1, **f64)
        for j in range(n_sub + 1):
            pre = record[readout_key(self.pre_name, j)].double() if j < n_sub else self.collapse_vector(**f64)
            M[..., :, j] = einsum(C, pre.expand(B, T, n), "b t s n, b t n -> b t s")
            if j < n_sub:
                C = einsum(record[readout_key("res_map", j)].double(), C, "b t i k, b t s k -> b t s i")
                C[..., j + 1, :] = record[readout_key(self.post_name, j)].double()
        return M

"""mHC: Manifold-Constrained Hyper-Connections (Xie et al. 2025, arXiv 2512.24880, Eq. 7-9; docs/designs.md#hc).

n streams x (n x d per token, row = stream). Each sublayer j has its own mHC router:

    x̃'      = RMSNorm(vec(x)) (1 x nd)       flattened over all streams, no gain
    H̃^pre   = α_pre  · (x̃' φ_pre)  + b_pre   (1 x n)
    H̃^post  = α_post · (x̃' φ_post) + b_post  (1 x n)
    H̃^res   = α_res  · mat(x̃' φ_res) + b_res (n x n), row = destination
    H^pre = σ(H̃^pre),  H^post = 2σ(H̃^post),  H^res = SK(exp H̃^res)
    x_{j+1} = H^res x_j + H^post^T F_j(H^pre x_j)

SK: Sinkhorn-Knopp, M_0 = exp(H̃^res), then t_max times column-normalise, then row-normalise. The rows sum
to 1 up to rounding, the columns up to the (recorded) Sinkhorn error.

Parameters: phi [nd, n^2+2n], columns ordered [pre (n) | post (n) | res (n^2, row-major [dest, source])];
bias [n^2+2n]; alpha_pre/alpha_post/alpha_res = mhc_gating_init (0.01). nd(n^2+2n) + (n^2+2n) + 3
parameters per sublayer (96d + 27 for n=4). Two inits (`cfg.mhc_init`, docs/concepts.md#effective-rank):

* "identity" (default): the MindFormers port (`hyper_connection.py`): b_res = 5(I - 1), so H_res = SK(exp b_res)
  starts near I (diagonal ~0.98); b_pre = -log(n-1) (-log 3 at n=4), so H_pre = 1/n; b_post = 0, H_post = 1;
  phi ~ N(0, sigma^2 = 1e-4). DeepSeek describes mHC as restoring the identity mapping of the residual.
* "zero": NVIDIA Megatron-LM `HyperConnectionModule._init_weights`: phi xavier_uniform, b = 0. Every H_res
  starts at J/n; the first map then mixes identical streams and the last feeds a sum, so both get exactly
  zero gradient and stay uniform: every full product has effective rank 1 however long the model trains.
Megatron stores h_res as [source, dest]: permute the res columns by the transpose when loading its weights.

In the shared stream notation (streams.py): pre = H^pre, post = H^post, res_map = H^res.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from einops import rearrange
from torch import nn

from .streams import MultiStreamDesign, StreamRouter, map_dtype


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """SK(exp(logits)) over the last two dims (..., n, n): `iters` x (column-normalise, row-normalise).

    The per-matrix max is subtracted before exp (an overall scale, removed exactly by the first step).
    """
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)  # columns sum to 1
        m = m / m.sum(-1, keepdim=True)  # rows sum to 1
    return m


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMS normalisation over the last dim, in x's dtype."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class MHCRouter(StreamRouter):
    def __init__(self, d: int, n: int, eps: float, gating_init: float, sinkhorn_iters: int, init: str = "identity"):
        super().__init__()
        self.n, self.eps, self.t_max = n, eps, sinkhorn_iters
        self.phi = nn.Parameter(torch.empty(n * d, n * n + 2 * n))  # [φ_pre | φ_post | φ_res]
        self.bias = nn.Parameter(torch.zeros(n * n + 2 * n))  # [b_pre | b_post | b_res]
        if init == "zero":  # Megatron-LM
            nn.init.xavier_uniform_(self.phi)
        else:  # MindFormers: near-identity H_res, H_pre = 1/n, H_post = 1
            nn.init.normal_(self.phi, std=1e-2)
            with torch.no_grad():
                self.bias[:n] = -math.log(n - 1) if n > 1 else 0.0
                self.bias[2 * n :] = (5.0 * (torch.eye(n) - 1.0)).flatten()
        self.alpha_pre = nn.Parameter(torch.tensor(float(gating_init)))
        self.alpha_post = nn.Parameter(torch.tensor(float(gating_init)))
        self.alpha_res = nn.Parameter(torch.tensor(float(gating_init)))

    def _split(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., n^2+2n) -> pre (..., n), post (..., n), res (..., n, n) [dest, source]."""
        n = self.n
        return v[..., :n], v[..., n : 2 * n], rearrange(v[..., 2 * n :], "... (i k) -> ... i k", i=n)

    def _project(self, pre_l, post_l, res_l):
        return torch.sigmoid(pre_l), 2.0 * torch.sigmoid(post_l), sinkhorn(res_l, self.t_max)

    def maps(self, x, j, ctx):
        dt = map_dtype(x)
        xn = _rms(rearrange(x.to(dt), "b t n d -> b t (n d)"), self.eps)  # (B, T, nd)
        z_pre, z_post, z_res = self._split(xn @ self.phi.to(dt))
        b_pre, b_post, b_res = self._split(self.bias.to(dt))
        pre_l = self.alpha_pre.to(dt) * z_pre + b_pre  # (B, T, n)
        post_l = self.alpha_post.to(dt) * z_post + b_post  # (B, T, n)
        res_l = self.alpha_res.to(dt) * z_res + b_res  # (B, T, n, n) [dest, source]
        H_pre, H_post, H_res = self._project(pre_l, post_l, res_l)
        for name, v in (
            ("H_pre_logits", pre_l),
            ("H_post_logits", post_l),
            ("H_res_logits", res_l),
            ("H_pre", H_pre),
            ("H_post", H_post),
            ("H_res", H_res),
        ):
            ctx.put(name, v, sublayer=j)
        if ctx.record is not None:
            ctx.put("sinkhorn_row_err", (H_res.sum(-1) - 1).abs().amax(-1), sublayer=j)  # (B, T)
            ctx.put("sinkhorn_col_err", (H_res.sum(-2) - 1).abs().amax(-1), sublayer=j)  # (B, T)
        return H_pre, H_post, H_res

    @torch.no_grad()
    def readout(self) -> dict[str, Any]:
        """Static part: the maps at zero dynamic input, σ(b_pre), 2σ(b_post), SK(exp(b_res))."""
        H_pre, H_post, H_res = self._project(*self._split(self.bias.double()))
        return {
            "H_pre": H_pre,
            "H_post": H_post,
            "H_res": H_res,
            "res_map": H_res.clone(),
            "alpha_pre": float(self.alpha_pre),
            "alpha_post": float(self.alpha_post),
            "alpha_res": float(self.alpha_res),
            "t_max": self.t_max,
        }


class MHC(MultiStreamDesign):
    slug = "mhc"
    pre_name, post_name = "H_pre", "H_post"

    def build_router(self, j: int) -> MHCRouter:
        cfg = self.cfg
        return MHCRouter(cfg.d_model, self.n, cfg.norm_eps, cfg.mhc_gating_init, cfg.mhc_sinkhorn_iters, cfg.mhc_init)

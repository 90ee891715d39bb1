"""HC: Hyper-Connections (Zhu et al. 2024, arXiv 2409.19606; docs/designs.md#hc).

n streams H (n x d per token). Each sublayer j has its own HC router (dynamic, tanh-gated: DHC):

    H̄   = Norm_j(H)                          row-wise RMSNorm with gain (one norm per stream)
    A_m = s_α tanh(H̄ W_m) + A_m^0   (n)       width connection: branch input x_in = A_m^T H
    A_r = s_α tanh(H̄ W_r) + A_r^0   (n x n)   index [source, dest]
    B   = s_β tanh(H̄ W_β) + B^0     (n)       depth connection: H' = A_r^T H + B^T F_j(x_in)

Parameters and init follow Algorithm 2 of the paper and lucidrains `HyperConnections` (same names):
static_alpha = [A_m^0 | A_r^0] [n, n+1] = [e_{j mod n} | I_n] with j the SUBLAYER index, dynamic_alpha_fn
= [W_m | W_r] [d, n+1] = 0, dynamic_alpha_scale s_α = 0.01, static_beta B^0 [n] = 1, dynamic_beta_fn W_β
[d] = 0, dynamic_beta_scale s_β = 0.01, norm.weight [d] = 1 (lucidrains' `norm.gamma + 1`). That is
d(n+3) + n^2 + 2n + 2 parameters per sublayer (7d + 26 for n = 4). At init every stream equals the
Pre-LN residual and the sum collapse gives n h_j. `hc_dynamic=False` (SHC) keeps only the static maps.

In the shared stream notation (streams.py): pre = A_m, post = B, res_map = A_r^T.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..backbone import RMSNorm
from .streams import MultiStreamDesign, StreamRouter, map_dtype


class HCRouter(StreamRouter):
    def __init__(self, d: int, n: int, j: int, eps: float, dynamic: bool = True):
        super().__init__()
        self.n = n
        alpha0 = torch.zeros(n, 1)
        alpha0[j % n, 0] = 1.0  # A_m^0 = e_{j mod n}
        self.static_alpha = nn.Parameter(torch.cat([alpha0, torch.eye(n)], dim=1))  # [n, n+1] = [A_m^0 | A_r^0]
        self.static_beta = nn.Parameter(torch.ones(n))  # B^0
        self.norm: RMSNorm | None = None  # SHC (static maps only) has no norm
        if dynamic:
            self.norm = RMSNorm(d, eps)
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(d, n + 1))  # [W_m | W_r]
            self.dynamic_alpha_scale = nn.Parameter(torch.tensor(0.01))  # s_α
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(d))  # W_β
            self.dynamic_beta_scale = nn.Parameter(torch.tensor(0.01))  # s_β

    def maps(self, x, j, ctx):
        dt = map_dtype(x)
        alpha = self.static_alpha.to(dt)  # (n, n+1)
        beta = self.static_beta.to(dt)  # (n,)
        if self.norm is not None:
            normed = self.norm(x.to(dt))  # (B, T, n, d), each stream normalised separately
            dyn_alpha = self.dynamic_alpha_scale.to(dt) * torch.tanh(normed @ self.dynamic_alpha_fn.to(dt))
            dyn_beta = self.dynamic_beta_scale.to(dt) * torch.tanh(normed @ self.dynamic_beta_fn.to(dt))
            ctx.put("A_m_dynamic", dyn_alpha[..., 0], sublayer=j)  # (B, T, n)
            ctx.put("A_r_dynamic", dyn_alpha[..., 1:], sublayer=j)  # (B, T, n, n) [source, dest]
            ctx.put("B_dynamic", dyn_beta, sublayer=j)  # (B, T, n)
            alpha, beta = alpha + dyn_alpha, beta + dyn_beta  # (B, T, n, n+1), (B, T, n)
        else:
            B, T, n, _ = x.shape
            alpha, beta = alpha.expand(B, T, n, n + 1), beta.expand(B, T, n)
        A_m, A_r = alpha[..., 0], alpha[..., 1:]  # (B, T, n), (B, T, n, n) [source, dest]
        ctx.put("A_m", A_m, sublayer=j)
        ctx.put("A_r", A_r, sublayer=j)
        ctx.put("B", beta, sublayer=j)
        return A_m, beta, A_r.transpose(-1, -2)  # res_map = A_r^T: column convention [dest, source]

    @torch.no_grad()
    def readout(self) -> dict[str, Any]:
        n = self.n
        A_m0, A_r0, B0 = self.static_alpha[:, 0], self.static_alpha[:, 1:], self.static_beta
        hc = torch.zeros(n + 1, n + 1, dtype=A_r0.dtype, device=A_r0.device)  # [[0, B], [A_m, A_r]]
        hc[0, 1:], hc[1:, 0], hc[1:, 1:] = B0, A_m0, A_r0
        out = {
            "A_m": A_m0.clone(),
            "A_r": A_r0.clone(),
            "B": B0.clone(),
            "hc_matrix": hc,
            "res_map": A_r0.T.clone(),
            "dynamic": self.norm is not None,
        }
        if self.norm is not None:
            out.update(s_alpha=float(self.dynamic_alpha_scale), s_beta=float(self.dynamic_beta_scale))
        return out


class HC(MultiStreamDesign):
    slug = "hc"
    pre_name, post_name = "A_m", "B"

    def build_router(self, j: int) -> HCRouter:
        cfg = self.cfg
        return HCRouter(cfg.d_model, self.n, j, cfg.norm_eps, dynamic=cfg.hc_dynamic)

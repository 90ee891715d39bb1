"""Attention Residuals (Kimi Team, arXiv 2603.15031): Full and Block AttnRes (docs/designs.md#attnres).

Both designs replace the additive residual with one depth-softmax per sublayer over a list of *sources*
(raw, un-normalised tensors (B, T, d)):

    k_i     = v_i / sqrt(mean(v_i^2) + eps)              weightless RMS key, gain folded into the query
    score_i = sum_d (gamma * w)[d] k_i[d]                = w . RMSNorm_gamma(v_i); no 1/sqrt(d), fp32
    alpha   = softmax_i(score)                           over SOURCES (depth), per token
    x       = sum_i alpha_i v_i                          mix the RAW sources

with a pseudo-query w (init 0, so alpha starts uniform and x is parallel to the Pre-LN residual) and a
key-norm gain gamma (init 1) per operator: two per layer plus one final operator. The designs differ only
in what the sources are, which is all this module specialises:

* Full AttnRes:  sources of sublayer j = [emb, v_0, ..., v_{j-1}]                     (state "v", "valid")
* Block AttnRes: sources = completed blocks [b_0 = emb, b_1, ...] + the current partial sum (state
  "blocks", "partial"); boundaries `cfg.block_starts` are positional (follow the layer position `pos`).

Skips (docs/concepts.md#notation): Full removes the skipped source from every later softmax on those tokens
(`attnres_skip="mask"`, logit -inf) or zeroes its value and keeps logit 0 (`"zero_value"`); Block does not
add the skipped write into the partial sum.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import torch
from einops import einsum
from torch import nn

from ..backbone import RMSNorm
from ..config import ModelConfig
from ..readouts import readout_key, sublayer_label
from .base import Design, Router, RunContext, State, SublayerCall, apply_keep


class AttnResOperator(nn.Module):
    """AttnRes(w, gamma; V): one pseudo-query softmax over depth sources (docs/designs.md#attnres).

    Parameters: `pseudo_query` w [d] (init 0, mandatory) and `key_norm.weight` gamma [d] (init 1). The key
    norm is weightless in the computation; gamma is folded into the query, score_i = (gamma*w) . rms(v_i).
    Also the final operator of both designs (the model's `final_router`).
    """

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.pseudo_query = nn.Parameter(torch.zeros(d_model))
        self.key_norm = RMSNorm(d_model, eps)  # holds gamma and eps; only its gain is used (folded into w)

    def query(self) -> torch.Tensor:
        """The folded query gamma * w (d,), fp32."""
        return self.key_norm.weight.float() * self.pseudo_query.float()

    def mix(
        self, v: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """v (B, T, S, d) raw sources, valid (B, T, S) bool or None -> x (B, T, d), alpha, logits (B, T, S).

        Runs in fp32 even under autocast. Invalid sources get logit -inf (alpha exactly 0).
        """
        with torch.autocast(v.device.type, enabled=False):
            v32 = v.float()  # (B, T, S, d)
            inv_rms = torch.rsqrt(v32.pow(2).mean(-1) + self.key_norm.eps)  # (B, T, S)
            # (v . q) / rms(v) == q . rms(v): keeps one (B, T, S, d) tensor alive for backward instead of two
            logits = einsum(v32, self.query(), "b t s d, d -> b t s") * inv_rms  # (B, T, S)
            if valid is not None:
                logits = logits.masked_fill(~valid, float("-inf"))
            alpha = logits.softmax(-1)  # (B, T, S)
            x = einsum(alpha, v32, "b t s, b t s d -> b t d")
        return x.to(v.dtype), alpha, logits

    def put(
        self,
        ctx: RunContext,
        j: int | None,
        v: torch.Tensor,
        alpha: torch.Tensor,
        logits: torch.Tensor,
        labels: list[str],
        own: bool,
    ) -> None:
        """Record the per-token readouts of sublayer j (None: the final operator);
        docs/concepts.md#attnres-dead-prefix."""
        final = j is None
        ctx.put("alpha", alpha, j, final=final)  # (B, T, S) fp32
        ctx.put("logits", logits, j, final=final)  # (B, T, S) fp32, -inf on removed sources
        ctx.put("source_labels", labels, j, final=final)
        # weight on the last source = the layer's own computation; NaN where that source is not "own"
        self_weight = alpha[..., -1] if own else torch.full_like(alpha[..., -1], float("nan"))
        ctx.put("self_weight", self_weight, j, final=final)
        ctx.put("embedding_weight", alpha[..., 0], j, final=final)
        ctx.put("source_rms", v.float().pow(2).mean(-1).sqrt().mean((0, 1)), j, final=final)  # (S,)

    def readout(self) -> dict[str, Any]:
        return {
            "query_norm": float(self.pseudo_query.detach().norm()),
            "effective_query_norm": float(self.query().detach().norm()),
            "w": self.pseudo_query.detach().clone(),
            "gamma": self.key_norm.weight.detach().clone(),
        }


class AttnResRouter(AttnResOperator, Router):
    """Read x_j = AttnRes(sources), run the body, write y_j = F_j(N_j(x_j)) back (after the keep mask).

    What the sources are and how a write enters the state is the design's (`_AttnResDesign`); the router
    only owns the operator's parameters, which stay at their position under `swap="body"`.
    """

    def __init__(self, design: _AttnResDesign):
        super().__init__(design.cfg.d_model, design.cfg.norm_eps)
        self.design = design  # plain attribute (a stateless strategy, not a module)

    def forward(self, state: State, call: SublayerCall) -> tuple[State, torch.Tensor]:
        branch, j, pos, ctx, keep, carry = call.branch, call.j, call.pos, call.ctx, call.keep, call.carry
        dsg = self.design
        v, valid = dsg.sources(state)  # (B, T, S, d), (B, T, S) | None
        x, alpha, logits = self.mix(v, valid)
        if ctx.record is not None:
            self.put(ctx, j, v, alpha, logits, dsg.source_labels(state, j, pos), dsg.is_own(j, pos))
        state = dsg.before_write(state, j, pos)
        y = apply_keep(branch(x), keep)  # (B, T, d), the write as it enters the state
        return dsg.write(state, y, keep), y if carry is None else carry + y  # u_l = v_2l + v_2l+1


class _AttnResDesign(Design):
    """What Full and Block share: routers, final operator, read-only virtual-residual view, M[i -> j]."""

    editable_view = False
    norm_reads_view = final_reads_view = False  # every norm reads a depth-softmax mix, not the virtual residual
    view_name = (
        "virtual residual: embedding + every sublayer output so far (read-only; AttnRes has no "
        "single stream, branch inputs are at hook_attn_in / hook_mlp_in)"
    )

    def make_router(self, j: int) -> Router:
        return AttnResRouter(self)

    def make_final_router(self) -> nn.Module:
        return AttnResOperator(self.cfg.d_model, self.cfg.norm_eps)

    def set_view(self, state: State, value: torch.Tensor) -> State:
        raise NotImplementedError(f"{self.slug}: the residual view is read-only ({self.view_name})")

    def final(self, state: State, final_router: nn.Module | None, ctx: RunContext) -> torch.Tensor:
        """h_out = AttnRes(w_out, gamma_out; all sources) (B, T, d)."""
        assert isinstance(final_router, AttnResOperator)  # make_final_router's
        v, valid = self.sources(state)
        x, alpha, logits = final_router.mix(v, valid)
        if ctx.record is not None:
            final_router.put(ctx, None, v, alpha, logits, self.source_labels(state, None, None), True)
        return x

    # --- design-specific pieces -------------------------------------------------------------------------
    def sources(self, state: State) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sources (B, T, S, d) the next operator reads, and their validity (B, T, S) or None."""
        raise NotImplementedError

    def source_labels(self, state: State, j: int | None, pos: int | None) -> list[str]:
        """Names of the sources for sublayer j at layer position pos (j = None: the final operator)."""
        raise NotImplementedError

    def is_own(self, j: int, pos: int) -> bool:
        """Whether the last source holds the layer's own (or its block's own) computation."""
        raise NotImplementedError

    def before_write(self, state: State, j: int, pos: int) -> State:
        return state

    def write(self, state: State, y: torch.Tensor, keep: torch.Tensor | None) -> State:
        raise NotImplementedError

    def source_slot(self, i: int) -> int:
        """Index of the operator source that contains depth source i (0 = emb, i >= 1 = sublayer i-1)."""
        raise NotImplementedError

    # --- readouts ----------------------------------------------------------------------------------------
    def depth_mixing(self, record: dict[str, Any], n_sub: int) -> torch.Tensor:
        """M[..., i, j] = alpha of the operator source containing source i, in the input of sublayer j.

        Full: the softmax weights themselves. Block: every sublayer output inside a block carries that
        block's (or the partial's) weight. Either way x_j = sum_i M[i, j] v_i (v_0 = emb).
        """
        ref = record[readout_key("alpha", final=True)]
        B, T = ref.shape[:2]
        M = torch.zeros(B, T, n_sub + 1, n_sub + 1, dtype=torch.float64, device=ref.device)
        for j in range(n_sub + 1):
            alpha = record[
                readout_key("alpha", final=True) if j == n_sub else readout_key("alpha", j)
            ].double()  # (B, T, S_j)
            slots = torch.tensor([self.source_slot(i) for i in range(j + 1)], device=ref.device)
            M[..., : j + 1, j] = alpha[..., slots]
        return M


class FullAttnRes(_AttnResDesign):
    """x_j = AttnRes(w_j, gamma_j; [v_0 = emb, v_1..v_j]) over every earlier sublayer output (docs/designs.md#attnres).

    State: "v" (B, T, S, d) the raw sources so far (S = j+1 before sublayer j), "valid" (B, T, S) bool.
    The state is re-concatenated per sublayer, so autograd keeps O(L^2) source copies in training.
    """

    slug = "full_attnres"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.skip_mode = getattr(cfg, "attnres_skip", "mask")

    def init_state(self, h0: torch.Tensor) -> State:
        return {"v": h0[:, :, None], "valid": torch.ones(*h0.shape[:2], 1, dtype=torch.bool, device=h0.device)}

    def view(self, state: State) -> torch.Tensor:
        return state["v"].sum(2)  # removed sources hold zeros (written after the keep mask)

    def sources(self, state):
        return state["v"], state["valid"]

    def source_labels(self, state, j, pos):
        return ["emb"] + [sublayer_label(k) for k in range(state["v"].shape[2] - 1)]

    def is_own(self, j, pos):
        return j > 0  # sublayer 0 reads the embedding only

    def write(self, state, y, keep):
        ok = torch.ones_like(y[..., :1], dtype=torch.bool)  # (B, T, 1)
        if keep is not None and self.skip_mode == "mask":
            ok = (keep != 0)[..., None]
        return {"v": torch.cat([state["v"], y[:, :, None]], 2), "valid": torch.cat([state["valid"], ok], 2)}

    def source_slot(self, i: int) -> int:
        return i


class BlockAttnRes(_AttnResDesign):
    """Block AttnRes with Kimi K3 semantics (docs/designs.md#attnres), boundaries `cfg.block_starts` in layers.

        blocks = [], partial = h_0
        layer l:  x_attn = AttnRes(blocks + [partial]);  if l starts a block: blocks += [partial], partial = 0
                  partial += Attn_l(N(x_attn));  x_mlp = AttnRes(blocks + [partial]);  partial += MLP_l(N(x_mlp))
        h_out = AttnRes(blocks + [partial])

    State: "blocks" (B, T, K, d) completed blocks (b_0 = emb after layer 0 starts), "partial" (B, T, d).
    """

    slug = "block_attnres"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.starts = list(cfg.block_starts)

    def init_state(self, h0: torch.Tensor) -> State:
        B, T, d = h0.shape
        return {"blocks": h0.new_zeros(B, T, 0, d), "partial": h0}  # no completed block before layer 0

    def view(self, state: State) -> torch.Tensor:
        return state["blocks"].sum(2) + state["partial"]

    def sources(self, state):
        return torch.cat([state["blocks"], state["partial"][:, :, None]], 2), None

    def _starts_block(self, j: int | None, pos: int | None) -> bool:
        return j is not None and j % 2 == 0 and pos in self.starts

    def source_labels(self, state, j, pos):
        K = state["blocks"].shape[2]
        names = [_block_label(k) for k in range(K)]
        return names + [_block_label(K) if self._starts_block(j, pos) else "partial"]

    def is_own(self, j, pos):
        return not self._starts_block(j, pos)  # at a block start the last source is the finished block

    def before_write(self, state, j, pos):
        if not self._starts_block(j, pos):
            return state
        p = state["partial"]
        return {"blocks": torch.cat([state["blocks"], p[:, :, None]], 2), "partial": torch.zeros_like(p)}

    def write(self, state, y, keep):
        return {**state, "partial": state["partial"] + y}  # a skipped token adds nothing

    def source_slot(self, i: int) -> int:
        return 0 if i == 0 else bisect_right(self.starts, (i - 1) // 2)  # 1-based block of sublayer i-1


def _block_label(k: int) -> str:
    return "emb" if k == 0 else f"block_{k}"

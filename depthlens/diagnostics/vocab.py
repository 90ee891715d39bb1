"""Next-token loss and KL against a reference run, with the LM head walked in vocabulary chunks.

A plain head writes (rows, V) float32 logits (50 MB for 256 rows of SmolLM2's 49K vocabulary) and every
reduction after it (logsumexp, the target gather, Σ p_ref·z) reads them back from memory. When the model's
head is one matmul (`models.protocol.Unembedding`), the vocabulary is walked in chunks of C rows of W instead:
each (rows, C) block of logits stays in cache while its max and Σ exp are taken (an online logsumexp), and
nothing of size V is kept. On SmolLM2-135M (248 rows, 2 threads) the head plus logsumexp drops from 134 ms
to 78 ms, below the 91 ms of the bare whole-vocabulary matmul (bench/profile_real_scale.py).

The KL to the reference needs Σ_v p_ref,v z_v, which for a linear head z = W h + b is (p_ref W)·h + p_ref·b.
The (rows, d) matrix p_ref W is built once per reference run (one more chunk walk); after that each run's KL
is a d-length dot per token:

    KL(p_ref ‖ p) = Σ_v p_ref (z_ref − z) + (lse − lse_ref) Σ_v p_ref
                  = (p_ref W)·(h_ref − h)  + (lse − lse_ref) Σ_v p_ref

Identical hidden states give exactly ΔNLL = 0 and KL = 0 (the same arithmetic on the same inputs).

Models without an Unembedding (logit soft-capping, a generic HF head) take the whole-logits path: the same
quantities from (b, T, V) logits, one reference-sized block of rows at a time.

Positions: a run covers tokens[:, :T−1] (the last token is only a target: by causality no loss position
depends on it), and the loss positions are τ = 1..T−2 predicting tokens[:, τ+1] (BOS position excluded), as
in `metrics.loss_log_probs`. Reductions are float32 whatever the model dtype, on the head's device (a model
placed over several devices hands its head input over there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from depthlens.models.protocol import LayeredLM, Unembedding, unembedding_of
from depthlens.models.residual.base import RunContext, State

# one (rows, C) float32 logit block: on the CPU about an L2 cache, so each chunk is reduced in cache; on an
# accelerator large blocks (few kernel launches), still far below whole logits for long row counts
BLOCK_BYTES = {"cpu": 2 << 20, "accelerator": 256 << 20}
# rows per vocabulary walk (on the CPU larger row blocks force smaller, less efficient chunks)
ROW_BLOCK = {"cpu": 512, "accelerator": 8192}


def _kind(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else "accelerator"


def chunk_size(rows: int, vocab: int, device: torch.device | str = "cpu") -> int:
    """Vocabulary rows per chunk for `rows` hidden states: a (rows, C) float32 block of ≈ BLOCK_BYTES for the
    device, a multiple of 256, at least 256 and at most the vocabulary."""
    block = BLOCK_BYTES[_kind(torch.device(device))]
    return int(min(vocab, max(256, block // (4 * max(rows, 1)) // 256 * 256)))


@torch.no_grad()
def logsumexp_and_target(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp over the vocabulary (R,), target logit (R,)) of logits F.linear(h, weight, bias), float32.

    h (R, d), weight (V, d), targets (R,) int64. The logits are formed chunk by chunk and never all at once;
    the target logit is read from the same chunk products as the logsumexp (so NLL = lse − z_target ≥ 0).
    chunk: vocabulary rows per chunk (default `chunk_size`).
    """
    R, V = h.shape[0], weight.shape[0]
    C = chunk or chunk_size(R, V, h.device)
    maxes, sums = [], []
    z_target = torch.zeros(R, dtype=torch.float32, device=h.device)
    floor = torch.finfo(torch.float32).min  # a chunk of −inf logits contributes exp(−inf) = 0, not NaN
    for c0 in range(0, V, C):
        z = F.linear(h, weight[c0 : c0 + C], None if bias is None else bias[c0 : c0 + C]).float()  # (R, C)
        rel = targets - c0
        inside = (rel >= 0) & (rel < z.shape[1])
        z_target = torch.where(inside, z.gather(1, rel.clamp(0, z.shape[1] - 1)[:, None])[:, 0], z_target)
        m = z.amax(1, keepdim=True).clamp_min(floor)  # (R, 1)
        sums.append(z.sub_(m).exp_().sum(1))
        maxes.append(m[:, 0])
    m, s = torch.stack(maxes, 1), torch.stack(sums, 1)  # (R, n_chunks)
    top = m.amax(1)
    return top + (s * (m - top[:, None]).exp()).sum(1).log(), z_target


@torch.no_grad()
def expected_embedding(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lse: torch.Tensor, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(p W (R, d), Σ_v p (R,)) for p = softmax(F.linear(h, weight, bias)) given its logsumexp, float32."""
    R, V = h.shape[0], weight.shape[0]
    C = chunk or chunk_size(R, V, h.device)
    pw = torch.zeros(R, weight.shape[1], dtype=torch.float32, device=h.device)
    total = torch.zeros(R, dtype=torch.float32, device=h.device)
    for c0 in range(0, V, C):
        w = weight[c0 : c0 + C]
        p = F.linear(h, w, None if bias is None else bias[c0 : c0 + C]).float().sub_(lse[:, None]).exp_()  # (R, C)
        pw.addmm_(p, w.float())
        total += p.sum(1)
    return pw, total


# a chunked walk of the head: (h_block (r, d), weight, bias, per_row_block (r,)) -> two outputs per row
_Walk = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def head_path(model: LayeredLM, chunked: bool = True) -> str:
    """How the loss reads the head, recorded with every result: 'vocab-chunked' or 'whole-logits'."""
    return "vocab-chunked" if chunked and unembedding_of(model) is not None else "whole-logits"


class LossAgainstReference:
    """Per-token NLL and KL(p_ref ‖ p) at the loss positions of runs against one reference run.

        loss = LossAgainstReference(model, ctx, tokens)   # tokens (b, T); runs cover tokens[:, :T−1]
        nll_ref = loss.reference(clean_final_state)       # (b, T−2), first
        nll, kl = loss(final_state)                       # state of n·b rows (n blocks of the b sequences)
                                                          # → (n·b, T−2) each

    `chunked` tells which path runs (True: the head walked in vocabulary chunks; False: whole logits).
    """

    def __init__(self, model: LayeredLM, ctx: RunContext, tokens: torch.Tensor, *, chunked: bool | None = None):
        self.model, self.ctx = model, ctx
        self.b, T = tokens.shape
        self.targets = tokens[:, 2:]  # (b, T−2)
        self.unembed: Unembedding | None = unembedding_of(model)
        self.chunked = self.unembed is not None if chunked is None else chunked and self.unembed is not None
        self.ref: dict[str, torch.Tensor] = {}

    # --- the chunked path ---------------------------------------------------------------------------------
    def _hidden(self, state: State) -> torch.Tensor:
        """Normed final hidden at the loss positions: (rows, T−2, d)."""
        assert self.unembed is not None  # the chunked path: `chunked` is False without an Unembedding
        return self.unembed.hidden(state, self.ctx)[:, 1:]

    def _by_row_blocks(self, walk: _Walk, h: torch.Tensor, per_row: torch.Tensor) -> list[torch.Tensor]:
        """walk(h_block (r, d), weight, bias, per_row_block (r,)) over ROW_BLOCK rows at a time; its outputs
        concatenated and reshaped to h's leading dims (rows, T−2, ...)."""
        u, rb = self.unembed, ROW_BLOCK[_kind(h.device)]
        assert u is not None  # the chunked path: `chunked` is False without an Unembedding
        flat, extra = h.reshape(-1, h.shape[-1]), per_row.reshape(-1)
        parts = [walk(flat[r : r + rb], u.weight, u.bias, extra[r : r + rb]) for r in range(0, flat.shape[0], rb)]
        return [torch.cat(outs).view(*h.shape[:2], *outs[0].shape[1:]) for outs in zip(*parts)]

    def _lse_target(self, h: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(lse, target logit), each (n·b, T−2), for hidden states h (n·b, T−2, d)."""
        lse, zt = self._by_row_blocks(logsumexp_and_target, h, self.targets.to(h.device).repeat(n, 1))
        return lse, zt

    # --- the whole-logits path ----------------------------------------------------------------------------
    def _logits(self, state: State) -> torch.Tensor:
        return self.model.head(state, self.ctx)[:, 1:].float()  # (rows, T−2, V)

    def _nll_kl_logits(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(NLL, KL) from one block of b rows of loss-position logits (b, T−2, V)."""
        lse = z.logsumexp(-1)
        nll = lse - z.gather(-1, self.targets.to(z.device)[..., None])[..., 0]
        r = self.ref
        kl = torch.linalg.vecdot(r["p"], r["z"] - z) + (lse - r["lse"]) * r["psum"]
        return nll, kl

    # --- API ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def reference(self, state: State) -> torch.Tensor:
        """Set the reference run (state of b rows); returns its NLL (b, T−2)."""
        if self.chunked:
            h = self._hidden(state)  # (b, T−2, d)
            lse, zt = self._lse_target(h, 1)
            pw, psum = self._by_row_blocks(expected_embedding, h, lse)  # (b, T−2, d), (b, T−2)
            self.ref = {"h": h.float(), "lse": lse, "pw": pw, "psum": psum}
            return lse - zt
        z = self._logits(state)
        lse = z.logsumexp(-1)
        p = (z - lse[..., None]).exp_()
        self.ref = {"z": z, "lse": lse, "p": p, "psum": p.sum(-1)}
        return lse - z.gather(-1, self.targets.to(z.device)[..., None])[..., 0]

    @torch.no_grad()
    def __call__(self, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """(NLL, KL(p_ref ‖ p)) per token, each (n·b, T−2), for a state of n·b rows."""
        if not self.ref:
            raise RuntimeError("LossAgainstReference: call reference() first")
        rows = next(iter(state.values())).shape[0]
        n, r = rows // self.b, self.ref
        if self.chunked:
            h = self._hidden(state)  # (n·b, T−2, d)
            lse, zt = self._lse_target(h, n)
            dh = r["h"] - h.float().view(n, *r["h"].shape)  # (n, b, T−2, d): h_ref − h per block
            dlse = lse.view(n, *r["lse"].shape) - r["lse"]  # (n, b, T−2)
            kl = torch.linalg.vecdot(r["pw"], dh) + dlse * r["psum"]
            return lse - zt, kl.reshape(rows, -1)
        outs = [
            self._nll_kl_logits(self._logits({k: v[k0 : k0 + self.b] for k, v in state.items()}))
            for k0 in range(0, rows, self.b)
        ]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

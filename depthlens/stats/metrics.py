"""Pure math for the layer diagnostics (definitions: docs/concepts.md). No model code here.

Everything takes already-selected states/matrices and returns tensors or plain numbers:

- angular distance (#angular-distance): `angular_distance`, `angular_distance_matrix`, `AngularAccumulator`
- causal-score ratios (#causal-score): `relative_change`, `pooled_relative_change` (aggregated by `causal._CellStore`)
- effective rank of mixing products (#effective-rank): `effective_rank`, `amax_gain`, `mixing_products`,
`window_profile`
- dead prefix (#attnres-dead-prefix): `dead_prefix`
- late window (#late-window): `late_window`, `late_pairs`;  ranking (#thresholds): `kendall_tau`

Precision: angles and ratios are computed in float32 at least (float64 inputs stay float64) because bf16
states lose the small angles/ratios we care about; SVDs and matrix products run in float64 because HC
products can have gains around 1e3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from scipy import stats as _sps

# ---------------------------------------------------------------------------------------------------------------
# dtype helpers


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16/int inputs are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _as_float(*tensors) -> list[torch.Tensor]:
    ts = [torch.as_tensor(t) for t in tensors]
    dtype = _compute_dtype(*ts)
    return [t.to(dtype) for t in ts]


# ---------------------------------------------------------------------------------------------------------------
# angular distance


def _unit(x: torch.Tensor, dim: int) -> torch.Tensor:
    # A zero vector gives 0/0 = NaN, which propagates to d = NaN (the direction is undefined).
    return x / torch.linalg.vector_norm(x, dim=dim, keepdim=True)


def _angle_between_units(xh: torch.Tensor, yh: torch.Tensor, dim: int) -> torch.Tensor:
    # atan2(|x̂-ŷ|, |x̂+ŷ|) = θ/2 exactly, and unlike arccos(cos θ) it keeps full relative precision as θ -> 0.
    num = torch.linalg.vector_norm(xh - yh, dim=dim)
    den = torch.linalg.vector_norm(xh + yh, dim=dim)
    return torch.atan2(num, den) * (2.0 / math.pi)


def angular_distance(x: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Angular distance d(x, y) = θ/π ∈ [0, 1] along `dim` (Gromov et al. 2024), broadcasting x against y.

    Stable form d = (2/π)·atan2(‖x̂−ŷ‖, ‖x̂+ŷ‖) with x̂ = x/‖x‖. Computed in float32, or float64 if either input
    is float64. A zero vector has no direction, so d is NaN there. Units: fraction of π (dimensionless).
    """
    x, y = _as_float(x, y)
    return _angle_between_units(_unit(x, dim), _unit(y, dim), dim)


def _angular_sums(states: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Per-(ℓ, n) sums over tokens of d(h_ℓ, h_{ℓ+n}).

    states: [S, ..., d] with S = L+1 residual states; the middle dims are flattened into N tokens.
    Returns (sums [S, S] float64 on CPU, NaN where ℓ+n > L; N).
    """
    (states,) = _as_float(states)
    if states.ndim < 2:
        raise ValueError(f"states must be [L+1, ..., d], got shape {tuple(states.shape)}")
    S, d = states.shape[0], states.shape[-1]
    u = _unit(states.reshape(S, -1, d), dim=-1)  # normalise each state once, reuse for every offset n
    sums = torch.full((S, S), float("nan"), dtype=torch.float64)
    for n in range(S):
        dist = _angle_between_units(u[: S - n], u[n:], dim=-1)  # [S-n, N]: pairs (ℓ, ℓ+n)
        sums[: S - n, n] = dist.sum(dim=-1, dtype=torch.float64).cpu()
    return sums, u.shape[1]


class AngularAccumulator:
    """Streaming mean of the angular-distance matrix over token batches.

    `D[ℓ, n]` = mean over all tokens seen of d(h_ℓ, h_{ℓ+n}), ℓ, n = 0..L; NaN where ℓ + n > L.
    Keeps a float64 sum and a token count, so `update` over batches equals one call on the concatenation.
    """

    def __init__(self, n_states: int):
        if n_states < 1:
            raise ValueError(f"n_states must be >= 1, got {n_states}")
        self.n_states = n_states  # L + 1
        self._sum = torch.zeros(n_states, n_states, dtype=torch.float64)
        self.count = 0

    def update(self, states: torch.Tensor) -> AngularAccumulator:
        """Add a batch. states: [L+1, ..., d] (token dims are flattened). Returns self."""
        if states.shape[0] != self.n_states:
            raise ValueError(f"expected {self.n_states} states on dim 0, got {states.shape[0]}")
        sums, n = _angular_sums(states)
        self._sum += sums  # invalid (ℓ+n > L) cells become NaN and stay NaN
        self.count += n
        return self

    def result(self) -> torch.Tensor:
        """Mean matrix D: float64 tensor [L+1, L+1] indexed [ℓ, n]."""
        if self.count == 0:
            raise ValueError("AngularAccumulator.result() called before any tokens were added")
        return self._sum / self.count


def angular_distance_matrix(states: torch.Tensor) -> torch.Tensor:
    """D[ℓ, n] = mean over tokens of d(h_ℓ, h_{ℓ+n}) for ℓ, n = 0..L (NaN where ℓ + n > L).

    states: [L+1, N, d] (or [L+1, B, T, d]; the token dims are flattened), already restricted to the measured
    positions. Returns float64 [L+1, L+1]; column n = 0 is 0, column 1 is the per-layer profile D_1(ℓ).
    """
    return AngularAccumulator(states.shape[0]).update(states).result()


# ---------------------------------------------------------------------------------------------------------------
# causal-score ratios


def loss_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits at the loss positions τ = 1..T−2 (see `loss_log_probs`): (B, T−2, V) float32."""
    return logits[:, 1:-1].float()


def loss_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log p over the vocabulary at the loss positions τ = 1..T−2: (B, T−2, V) float32, targets tokens[:, 2:].

    Position 0 (BOS) and the last position (it predicts nothing inside the window) are excluded; the causal
    and permutation scores both measure their losses here.
    """
    return torch.log_softmax(loss_logits(logits), dim=-1)


def relative_change(new: torch.Tensor, old: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-token ratio ‖new − old‖ / max(‖old‖, eps) over the last dim (Csordás' `test_effect` ratio).

    new, old: [..., d]. Returns [...] in float32 (float64 if an input is float64). Dimensionless.
    """
    new, old = _as_float(new, old)
    num = torch.linalg.vector_norm(new - old, dim=-1)
    den = torch.linalg.vector_norm(old, dim=-1).clamp_min(eps)
    return num / den


def _squared_norms(new: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ‖new − old‖² and ‖old‖² over the last dim, float64 (they are summed over many tokens)."""
    new, old = (t.to(torch.float64) for t in _as_float(new, old))
    return (new - old).square().sum(-1), old.square().sum(-1)


def pooled_relative_change(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Pooled ratio ‖U' − U‖_F / ‖U‖_F over all tokens (robust to tiny per-token denominators).

    new, old: [..., d]. Returns a float64 scalar tensor; NaN/inf if ‖U‖_F = 0.
    """
    num_sq, den_sq = _squared_norms(new, old)
    return (num_sq.sum() / den_sq.sum()).sqrt()


# ---------------------------------------------------------------------------------------------------------------
# effective rank of residual-mixing products
#
# CONVENTION (column action, later matrix on the LEFT):
#     x_{k+1} = H_k @ x_k            (x is a column vector of n stream coefficients)
#     P_{a→b} = H_{b-1} @ H_{b-2} @ ... @ H_a        so  x_b = P_{a→b} @ x_a.
# Implementations that apply H from the right / transposed (e.g. einsum "s t, ... s d -> ... t d", which applies
# Hᵀ to the streams) must transpose their matrices before calling these functions. σ(AB) ≠ σ(BA) in general, so
# the order changes the effective rank.


def effective_rank(A) -> torch.Tensor:
    """Roy & Vetterli effective rank exp(H(p)), p = σ/Σσ, over the last two dims (float64 SVD).

    A: [..., n, m]. Returns float64 [...] in [1, rank A]; NaN for an all-zero matrix (undefined).
    Scale-, transpose- and orthogonal-invariant, so report it together with `amax_gain`.
    """
    A = torch.as_tensor(A).to(torch.float64)
    sv = torch.linalg.svdvals(A)
    total = sv.sum(-1, keepdim=True)
    p = sv / total
    entropy = -torch.xlogy(p, p).sum(-1)  # xlogy gives 0·log 0 = 0 for exactly-zero singular values
    return torch.where(total.squeeze(-1) > 0, entropy.exp(), torch.nan)


def amax_gain(P) -> tuple[torch.Tensor, torch.Tensor]:
    """mHC "Amax gain": (forward = max_i Σ_j |P_ij| (∞-norm), backward = max_j Σ_i |P_ij| (1-norm)), float64 [...]."""
    P = torch.as_tensor(P).to(torch.float64).abs()
    return P.sum(-1).amax(-1), P.sum(-2).amax(-1)


def mixing_products(H, start: int, stop: int) -> torch.Tensor:
    """P_{start→stop} = H_{stop−1} ··· H_{start} (later factor on the left; see the CONVENTION above).

    H: [..., K, n, n] per-sublayer mixing matrices H^res_k, batched over leading dims (e.g. tokens).
    Requires 0 ≤ start ≤ stop ≤ K; start == stop gives the identity. Returns float64 [..., n, n].
    """
    H = torch.as_tensor(H).to(torch.float64)
    K, n = H.shape[-3], H.shape[-1]
    if not 0 <= start <= stop <= K:
        raise ValueError(f"need 0 <= start <= stop <= K={K}, got start={start}, stop={stop}")
    P = torch.eye(n, dtype=torch.float64, device=H.device).expand(*H.shape[:-3], n, n)
    for k in range(start, stop):
        P = H[..., k, :, :] @ P
    return P


def window_profile(H, widths: Sequence[int]) -> torch.Tensor:
    """Mean over start positions a = 0..K−w of erank(P_{a→a+w}), for each width w.

    H: [..., K, n, n]. Returns float64 [..., len(widths)], still per token (leading dims) so callers can take
    the mean (the headline, docs/concepts.md#effective-rank: mean of per-token eranks, NOT erank of the mean product),
    median or IQR.
    Widths larger than K give NaN.
    """
    H = torch.as_tensor(H).to(torch.float64)
    K, n = H.shape[-3], H.shape[-1]
    out = []
    for w in widths:
        if w < 1:
            raise ValueError(f"window widths must be >= 1, got {w}")
        if w > K:
            out.append(torch.full(H.shape[:-3], torch.nan, dtype=torch.float64, device=H.device))
            continue
        n_starts = K - w + 1
        # All windows at once: P[..., a] accumulates H_{a+j} @ P for j = 0..w-1.
        P = torch.eye(n, dtype=torch.float64, device=H.device).expand(*H.shape[:-3], n_starts, n, n)
        for j in range(w):
            P = H[..., j : j + n_starts, :, :] @ P
        out.append(effective_rank(P).mean(-1))
    return torch.stack(out, dim=-1)


# ---------------------------------------------------------------------------------------------------------------
# dead prefix, late window, ranking


def dead_prefix(self_weight_per_layer, eps: float = 0.05, nan_policy: str = "raise") -> int:
    """k* = max{k : s_l < eps for all l < k}: the number of leading layers with self-weight below eps.

    self_weight_per_layer: [L] mean self-weight s_l per layer. NaN (undefined self-weight, e.g. where the
    partial equals the embedding) raises unless nan_policy="skip", which lets NaN layers extend the prefix.
    """
    if nan_policy not in ("raise", "skip"):
        raise ValueError(f"nan_policy must be 'raise' or 'skip', got {nan_policy!r}")
    s = np.asarray(self_weight_per_layer, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"self weights must be 1-D [L], got shape {s.shape}")
    nan = np.isnan(s)
    if nan.any() and nan_policy == "raise":
        raise ValueError(f"self weights contain NaN at layers {np.flatnonzero(nan).tolist()}")
    alive = (s >= eps) & ~nan
    return int(np.argmax(alive)) if alive.any() else int(s.size)


def kendall_tau(a, b) -> float:
    """Kendall τ-b between a and b (scipy), over the positions where both are finite.

    Returns NaN when fewer than 2 finite pairs remain or either side is constant (τ undefined); scipy is not
    called then, because it warns in those cases.
    """
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"kendall_tau needs equal lengths, got {a.size} and {b.size}")
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(_sps.kendalltau(a, b).statistic)


_START_RULES = {"quarter": 4, "half": 2}


def late_window(L: int, start_rule: str | int = "quarter") -> int:
    """First layer of the late window Λ = {start, ..., L−1}.

    start_rule: "quarter" → ⌊L/4⌋ (default, docs/concepts.md#late-window), "half" → ⌊L/2⌋, "zero" → 0, or an explicit
    int.
    """
    if L < 1:
        raise ValueError(f"L must be >= 1, got {L}")
    if isinstance(start_rule, str):
        if start_rule == "zero":
            return 0
        if start_rule not in _START_RULES:
            raise ValueError(f"unknown start rule {start_rule!r}; use 'quarter', 'half', 'zero' or an int")
        return L // _START_RULES[start_rule]
    start = int(start_rule)
    if not 0 <= start < L:
        raise ValueError(f"window start must be in [0, {L - 1}], got {start}")
    return start


def late_pairs(L: int, start: str | int = "quarter") -> np.ndarray:
    """Late pair set P = {(i, j): start ≤ i < j ≤ L−1} as an int array [|P|, 2], i-major order.

    start: a layer index or a `late_window` rule. For L = 8, 16, 32 with "quarter": |P| = 15, 66, 276.
    """
    a = late_window(L, start)
    i, j = np.triu_indices(L - a, k=1)
    return np.stack([i + a, j + a], axis=1).astype(np.int64)

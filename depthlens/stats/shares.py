"""Shares over the late window, threshold sweeps, crossings, ranking robustness and the bootstrap
(docs/concepts.md#thresholds).

Matrix convention for pair scores X[i, j] ([L, L]): row i is the earlier (skipped / first-swapped) layer,
column j the later one, and the late pair set is P = {(i, j): start ≤ i < j ≤ L−1}, i.e. the strict upper
triangle of the late block. Only those entries are read; the rest of the matrix is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from depthlens.stats.metrics import kendall_tau, late_pairs


@dataclass(frozen=True)
class PerSequence:
    """A score matrix as per-sequence parts, so an interval can resample sequences: the matrix of a multiset of
    sequences with multiplicities c is the max over the drawn sequences of `values` (kind "max"), or
    Σc·num / Σc·den (kind "ratio"; its square root when `square`). Arrays are (layer, layer_other, sequence)."""

    kind: str  # "max" | "ratio"
    values: np.ndarray | None = None  # kind "max"
    num: np.ndarray | None = None  # kind "ratio"
    den: np.ndarray | None = None  # kind "ratio"; None = 1 per sequence (a counted mean)
    square: bool = False  # the matrix is sqrt(Σc·num / Σc·den): compare num/den with θ²
    fill: bool = False  # parts are sums and counts: a NaN part (no measurement there) counts as 0 in an interval


def late_values(matrix, start: int | str = "quarter", nan_policy: str = "raise") -> np.ndarray:
    """The late-pair entries X[i, j], start ≤ i < j ≤ L−1, as a float64 array [|P|] (i-major order).

    NaN entries raise ValueError unless nan_policy="omit", which drops them.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"expected a square [L, L] matrix, got shape {m.shape}")
    pairs = late_pairs(m.shape[0], start)
    if pairs.shape[0] == 0:
        raise ValueError(f"late window starting at {start!r} has fewer than 2 layers (L={m.shape[0]})")
    vals = m[pairs[:, 0], pairs[:, 1]]
    nan = np.isnan(vals)
    if nan.any():
        if nan_policy == "omit":
            return vals[~nan]
        if nan_policy != "raise":
            raise ValueError(f"nan_policy must be 'raise' or 'omit', got {nan_policy!r}")
        bad = [tuple(p) for p in pairs[nan][:5].tolist()]
        raise ValueError(f"{int(nan.sum())} late pairs are NaN, e.g. (i, j) = {bad}; pass nan_policy='omit'")
    return vals


def share_curve(matrix, thetas, start: int | str = "quarter", nan_policy: str = "raise") -> np.ndarray:
    """S(θ) = fraction of late pairs with X[i, j] > θ (strict), for each θ in `thetas`: float64 [len(thetas)].

    Non-increasing in θ by construction. All-NaN late pairs under nan_policy="omit" give NaN.
    """
    vals = late_values(matrix, start, nan_policy)
    thetas = np.asarray(thetas, dtype=np.float64)
    if vals.size == 0:
        return np.full(thetas.shape, np.nan)
    return (vals[None, :] > thetas.reshape(-1, 1)).mean(axis=1).reshape(thetas.shape)


def share_above(matrix, theta: float, start: int | str = "quarter", nan_policy: str = "raise") -> float:
    """S(θ) = (1/|P|) Σ_{(i,j)∈P} 1[X[i, j] > θ] with a strict ">" (docs/concepts.md#late-window)."""
    return float(share_curve(matrix, [theta], start, nan_policy)[0])


def crossing_points(thetas, curve, qs: Sequence[float] = (0.5, 0.25, 0.1, 0.01)) -> np.ndarray:
    """θ_q where the non-increasing curve S(θ) falls to q, for each q: float64 [len(qs)].

    Finds the first grid point k with S_k ≤ q and interpolates linearly between (θ_{k−1}, S_{k−1}) and
    (θ_k, S_k). NaN when the grid never brackets the crossing: S stays above q, or S_0 is already below q
    (the crossing lies left of the grid).
    """
    thetas, curve = np.asarray(thetas, dtype=np.float64), np.asarray(curve, dtype=np.float64)
    if thetas.shape != curve.shape or thetas.ndim != 1:
        raise ValueError(f"thetas and curve must be equal-length 1-D arrays, got {thetas.shape}, {curve.shape}")
    out = np.full(len(qs), np.nan)
    for n, q in enumerate(qs):
        below = np.flatnonzero(curve <= q)
        if below.size == 0:
            continue
        k = below[0]
        if k == 0:
            out[n] = thetas[0] if curve[0] == q else np.nan
            continue
        s0, s1 = curve[k - 1], curve[k]
        out[n] = thetas[k - 1] + (s0 - q) / (s0 - s1) * (thetas[k] - thetas[k - 1])
    return out


class RankingRobustness(NamedTuple):
    fraction: float  # share of the θ grid on which the ordering holds strictly
    holds: np.ndarray  # bool [n_theta]
    tau: np.ndarray | None  # Kendall τ between the ranking at each θ and at the headline θ (None if no headline)


def ranking_robustness(
    curves: Mapping[str, Sequence[float] | np.ndarray], order: Sequence[str], headline_index: int | None = None
) -> RankingRobustness:
    """How robust an architecture ordering is across the θ grid (docs/concepts.md#thresholds).

    curves: name → S(θ) on a common grid. order: names expected in strictly increasing order of S,
    e.g. ["preln", "hc", "full_attnres"] means S_preln < S_hc < S_full_attnres.
    `tau[k]` is Kendall τ-b between the curves' values at θ_k and at θ_headline (NaN where all tie).
    """
    if len(order) < 2:
        raise ValueError("an ordering needs at least 2 names")
    missing = [name for name in order if name not in curves]
    if missing:
        raise ValueError(f"no curve for {missing}; have {sorted(curves)}")
    S = np.stack([np.asarray(curves[name], dtype=np.float64) for name in order])  # [n_arch, n_theta]
    holds = np.all(np.diff(S, axis=0) > 0, axis=0)
    tau = None
    if headline_index is not None:
        ref = S[:, headline_index]
        tau = np.array([kendall_tau(S[:, k], ref) for k in range(S.shape[1])])
    return RankingRobustness(float(holds.mean()), holds, tau)


def bootstrap_ci(
    per_sequence_statistic_fn: Callable[[np.ndarray], float | np.ndarray],
    n_sequences: int,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[np.ndarray | float, np.ndarray | float, np.ndarray]:
    """Percentile bootstrap over sequences.

    Each resample draws `n_sequences` sequence indices with replacement and calls
    `per_sequence_statistic_fn(indices)`, which must recompute the FULL statistic from those sequences
    (including any max, so the extreme-value growth with sample size is reflected). The statistic may be a
    scalar or an array (e.g. a whole score matrix). Returns (low, high, samples [n_boot, ...]).
    NaN in a resample propagates to the interval.
    """
    if n_sequences < 1:
        raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    samples = np.stack(
        [
            np.asarray(per_sequence_statistic_fn(rng.integers(0, n_sequences, n_sequences)), dtype=np.float64)
            for _ in range(n_boot)
        ]
    )
    alpha = (1 - level) / 2
    low, high = np.quantile(samples, [alpha, 1 - alpha], axis=0)
    if samples.ndim == 1:
        return float(low), float(high), samples
    return low, high, samples


def paired_se(deltas_per_sequence) -> float:
    """Paired standard error sd(Δ_b)/√N (ddof=1) of per-sequence differences; NaN for N < 2."""
    d = np.asarray(deltas_per_sequence, dtype=np.float64).ravel()
    if d.size < 2:
        return float("nan")
    return float(d.std(ddof=1) / np.sqrt(d.size))

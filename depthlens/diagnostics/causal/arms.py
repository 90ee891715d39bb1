"""The causal engine's interventions and their cells (`causal.causal_scores` runs them).

An *arm* is one intervention on every sequence: skip layer s on the positions I, measure the later updates on F
(`current`: I = F = [1, T); `future`: I = [1, c), F = [c, T) for Csordás' cut positions c, which differ per
sequence). `_CellStore` keeps the per-token ratios of every (variant, s, t ≥ s) cell and the per-sequence sums
the aggregators and the bootstrap need.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from depthlens.errors import DepthlensError


def future_cut_table(T: int, n_seq: int, n_cuts: int = 4, seed: int = 123) -> np.ndarray:
    """Csordás' cut positions per sequence (docs/concepts.md#causal-score): one random.Random(seed) for the whole run; sequence n
    (eval order) reshuffles range(8, T−4, 8) and keeps the first n_cuts. (n_seq, K) int64, K = min(n_cuts, #)."""
    base = list(range(8, T - 4, 8))
    if not base:
        raise DepthlensError(f"the 'future' variant needs seq_len >= 13 for a cut position, got T={T}")
    rng, rows = random.Random(seed), []
    for _ in range(n_seq):
        cuts = list(base)
        rng.shuffle(cuts)
        rows.append(cuts[:n_cuts])
    return np.array(rows, dtype=np.int64).reshape(n_seq, min(n_cuts, len(base)))


def future_cuts(T: int, n_cuts: int = 4, seed: int = 123) -> list[int]:
    """The cut positions of the first sequence of a run (row 0 of `future_cut_table`)."""
    return [int(c) for c in future_cut_table(T, 1, n_cuts, seed)[0]]


@dataclass(frozen=True)
class Arm:
    """One intervention on every sequence: skip layer s on I, measure on F; the k-th cut of each sequence
    (the `future` cuts differ per sequence, so the masks are per sequence)."""

    variant: str
    s: int
    k: int  # cut index (0 for `current`)
    intervene: torch.Tensor  # (N, T) bool: positions I of each sequence
    measure: torch.Tensor  # (N, T) bool: positions F of each sequence
    null: bool = False  # skip nothing (noise floor)

    def measure_np(self, seqs: slice) -> np.ndarray:
        return self.measure[seqs].numpy()

    def keep(self, seqs: slice) -> torch.Tensor:
        I = self.intervene[seqs]
        return torch.ones_like(I) if self.null else ~I


def make_arms(
    T: int,
    N: int,
    layers: list[int],
    variants: Sequence[str],
    n_cuts: int,
    cut_seed: int,
    null: bool,
    first_seq: int = 0,
) -> tuple[list[Arm], dict[str, np.ndarray]]:
    """All arms, sorted by s (staircase order); plus the cut positions (N, K) of each variant: the `future` cuts
    of sequences first_seq .. first_seq + N − 1 of the run's cut sequence."""
    pos = torch.arange(T)
    arms, cuts = [], {}
    for v in variants:
        cuts[v] = (
            np.ones((N, 1), np.int64)
            if v == "current"
            else future_cut_table(T, first_seq + N, n_cuts, cut_seed)[first_seq:]
        )
        for k in range(cuts[v].shape[1]):
            c = torch.from_numpy(cuts[v][:, k])[:, None]  # (N, 1)
            if v == "current":
                I = Fm = (pos >= 1).expand(N, T)
            else:
                I, Fm = (pos >= 1) & (pos < c), pos >= c
            arms += [Arm(v, s, k, I, Fm) for s in layers]
            if null:
                arms.append(Arm(v, layers[0], k, I, Fm, null=True))
    arms.sort(key=lambda a: (a.s, a.null))
    return arms, cuts


# ---------------------------------------------------------------------------------------------------------------
# storage: per-token ratios of every (variant, s, t ≥ s) cell, pooled sums per sequence


class _CellStore:
    """Dense per-token ratios R[cell, seq, cut, τ] (NaN outside F) and per-sequence Σ‖Δ‖², Σ‖u‖².

    Only cells t ≥ s are stored (t < s is exactly 0: blocks before s never see the skip).
    Memory: n_cells · N · K · T float32, i.e. d times less than the updates themselves.
    """

    def __init__(self, layers: list[int], L: int, N: int, K: int, T: int, t_min_offset: int = 0):
        self.index = {(s, t): i for i, (s, t) in enumerate((s, t) for s in layers for t in range(s + t_min_offset, L))}
        n = len(self.index)
        self.R = np.full((n, N, K, T), np.nan, dtype=np.float32)
        self.num = np.zeros((n, N))
        self.den = np.zeros((n, N))

    def add(
        self, arms: list[Arm], t: int, seqs: slice, ratio: np.ndarray, diff_sq: np.ndarray, clean_sq: np.ndarray
    ) -> None:
        """Layer t of several arms: ratio, diff_sq (A, b, T) for the b sequences `seqs`; clean_sq (b, T) are the
        squared denominators (clean update or residual norm)."""
        cells = np.array([self.index[(a.s, t)] for a in arms])[:, None]
        ks = np.array([a.k for a in arms])[:, None]
        measure = np.stack([a.measure_np(seqs) for a in arms])  # (A, b, T)
        seq = np.arange(seqs.start, seqs.stop)[None, :]
        self.R[cells, seq, ks] = np.where(measure, ratio, np.nan)
        num, den = (diff_sq * measure).sum(-1), (clean_sq * measure).sum(-1)
        if len(np.unique(cells)) == len(cells):
            self.num[cells, seq] += num
            self.den[cells, seq] += den
        else:  # several cuts of one cell in this call: unbuffered add
            np.add.at(self.num, (cells, seq), num)
            np.add.at(self.den, (cells, seq), den)

    def per_sequence(self) -> dict[str, np.ndarray]:
        """Per (cell, sequence): max, sum, count of ratios, Σ‖Δ‖², Σ‖u‖² (enough for max/mean/pooled)."""
        ok = ~np.isnan(self.R)
        seq_max = np.where(ok, self.R, -np.inf).max(axis=(2, 3)).astype(np.float64)
        seq_max[np.isneginf(seq_max)] = np.nan
        return {
            "max": seq_max,
            "sum": np.where(ok, self.R, 0).sum(axis=(2, 3), dtype=np.float64),
            "count": ok.sum(axis=(2, 3)).astype(np.float64),
            "num": self.num,
            "den": self.den,
        }

    def aggregate(self) -> dict[str, np.ndarray]:
        """{aggregator: [n_cells]} over all tokens, cuts and sequences (numpy 'linear' quantiles)."""
        ps = self.per_sequence()
        out = {
            "max": _nanmax(ps["max"], axis=1),
            "mean": ps["sum"].sum(1) / np.maximum(ps["count"].sum(1), 1),
            "pooled": np.sqrt(self.num.sum(1) / np.where(self.den.sum(1) > 0, self.den.sum(1), np.nan)),
        }
        q = np.full((len(self.index), 2), np.nan)
        for c in range(len(self.index)):
            vals = self.R[c][~np.isnan(self.R[c])]
            if vals.size:
                q[c] = np.quantile(vals.astype(np.float64), [0.95, 0.99])
        out["p95"], out["p99"] = q[:, 0], q[:, 1]
        return out

    def to_matrix(self, values: np.ndarray, layers: list[int], L: int, lower: float = 0.0) -> np.ndarray:
        """[L, L] matrix: rows s in `layers` get `values` at t ≥ s and `lower` below; other rows NaN."""
        M = np.full((L, L) + values.shape[1:], np.nan)
        for s in layers:
            M[s, :s] = lower
        for (s, t), c in self.index.items():
            M[s, t] = values[c]
        return M


def _nanmax(a: np.ndarray, axis: int) -> np.ndarray:
    ok = ~np.isnan(a)
    m = np.where(ok, a, -np.inf).max(axis=axis)
    return np.where(ok.any(axis=axis), m, np.nan)

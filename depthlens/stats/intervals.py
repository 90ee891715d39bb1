"""Intervals for the headline shares and the claims built on them: which estimate, which method, which unit.

Every interval here qualifies its own point estimate (it is symmetric about it, then clipped to the range
the statistic can take, so the estimate always lies inside) and names its method and its unit of resampling.

Two levels of uncertainty (docs/concepts.md, "Thresholds, sweeps and uncertainty"):

* **eval sequences** (one checkpoint): a bootstrap over sequences. Shares whose per-pair score is a ratio of
  per-sequence sums (causal `mean`, `pooled`; permutation P_abs, P_rel, P_KL) are recomputed inside every
  resample. The causal `max` is an extreme-value statistic: a resample's max never exceeds the full-sample
  max, so a bootstrap of the share at all N sequences is not valid. Its estimate is the **size-fixed share
  at m < N sequences** (m-out-of-n): the exact mean, over every m-subset of the N sequences, of the share of
  late pairs whose max over the subset exceeds θ. Per pair that is 1 − C(N−k, m)/C(N, m), k the number of
  sequences whose own max exceeds θ, a U-statistic (smooth in k/N), whose bootstrap is valid.
* **training seeds** (a design at a depth): the per-seed estimates x_s are one run's value plus its eval
  sampling error, so their sample variance estimates the total variance of one run's value and the
  Student-t interval x̄ ± t_{n−1} s/√n is the interval for the design's mean (exact under normality). A
  hierarchical bootstrap (seeds, then sequences) is its resampling analogue but with 3 seeds it has only 10
  distinct seed resamples and undercovers (tests/test_intervals.py measures both). One seed: no training
  variance can be estimated; the sequence-level interval is reported and says so.

Every function is pure NumPy on arrays: `exceed` [P, N] bool (late pair × sequence), per-sequence sums
`num`, `den` [P, N], bootstrap `counts` [B, N] (multiplicity of each sequence in each resample).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, overload

import numpy as np
from scipy import stats as _sps

LEVEL = 0.95
SEQUENCES = "eval sequences"
SEEDS = "training seeds"
NORMAL_BOOT = "normal interval with bootstrap standard error"
SUBSAMPLED = "m-out-of-n size-fixed share (U-statistic over every m-subset)"
JACKKNIFE_T = "delete-one jackknife standard error, t interval (N-1 df)"
STUDENT_T = "Student t over per-seed estimates"
WELCH_T = "Welch t over per-seed estimates of two independent sets of runs"
PAIRED_T = "Student t over per-seed paired differences"
RISING_TOL = 0.01  # a share that grew by more than this over the last doubling of the eval set is "still rising"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its interval; `low <= estimate <= high` always holds (NaN: none)."""

    estimate: float
    low: float
    high: float
    method: str
    unit: str  # what was resampled: SEQUENCES or SEEDS
    n_units: int  # how many of them
    level: float = LEVEL

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def excludes_zero(self) -> int:
        """+1 when the whole interval is above 0, −1 below 0, 0 when it contains 0 (or is NaN)."""
        if not (np.isfinite(self.low) and np.isfinite(self.high)):
            return 0
        return 1 if self.low > 0 else -1 if self.high < 0 else 0


def _clip(estimate: float, half: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """estimate ± half, clipped to the statistic's range (the estimate stays inside)."""
    return max(estimate - half, bounds[0]), min(estimate + half, bounds[1])


def z_value(level: float = LEVEL) -> float:
    """Two-sided normal quantile Φ⁻¹((1 + level)/2)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(_sps.norm.ppf((1 + level) / 2))


def bootstrap_counts(n: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """[n_boot, n] int64: how often each of n units is drawn in each resample (n draws with replacement)."""
    if n < 1 or n_boot < 1:
        raise ValueError(f"need n >= 1 and n_boot >= 1, got n={n}, n_boot={n_boot}")
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)


def normal_interval(
    estimate: float,
    replicates: np.ndarray,
    *,
    level: float = LEVEL,
    method: str = NORMAL_BOOT,
    unit: str = SEQUENCES,
    n_units: int = 0,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> Interval:
    """estimate ± z·sd(replicates) (ddof=1), clipped to `bounds`."""
    reps = np.asarray(replicates, dtype=np.float64).ravel()
    if not np.isfinite(estimate) or reps.size < 2 or not np.isfinite(reps).all():
        return Interval(float(estimate), float("nan"), float("nan"), method, unit, n_units, level)
    lo, hi = _clip(float(estimate), z_value(level) * float(reps.std(ddof=1)), bounds)
    return Interval(float(estimate), lo, hi, method, unit, n_units, level)


# ---------------------------------------------------------------------------------------------------------------
# the causal max: size-fixed share at m sequences


def no_exceed_table(n: int, m: int) -> np.ndarray:
    """[n + 1] float64: r[k] = C(n−k, m) / C(n, m), the chance that a random m-subset of n sequences holds none
    of the k whose max exceeds θ (0 when n − k < m)."""
    if not 1 <= m <= n:
        raise ValueError(f"need 1 <= m <= n, got m={m}, n={n}")
    k = np.arange(n + 1, dtype=np.float64)
    r = np.ones(n + 1)
    for i in range(m):
        r *= np.clip(n - k - i, 0, None) / (n - i)
    return r


def default_subsample(n: int) -> int:
    """m = ⌈n/2⌉: the size at which the max share is estimated with an interval (m = n has none)."""
    return max(1, (n + 1) // 2)


@overload
def subsampled_share(exceed: np.ndarray, m: int, counts: None = None) -> float: ...
@overload
def subsampled_share(exceed: np.ndarray, m: int, counts: np.ndarray) -> np.ndarray | float: ...
def subsampled_share(exceed: np.ndarray, m: int, counts: np.ndarray | None = None) -> np.ndarray | float:
    """Mean over late pairs of P(some sequence of a random m-subset exceeds θ) = 1 − C(N−k, m)/C(N, m).

    exceed: [P, N] bool, whether sequence n's max of pair p exceeds θ. counts: None (the sample itself) or
    [N] / [B, N] multiplicities of a resample (a drawn sequence counts as often as it was drawn; the
    resample has Σ counts = N items). m = N gives the ordinary share of pairs whose max over all N exceeds θ.
    """
    e = np.asarray(exceed, dtype=bool)
    P, N = e.shape
    if P == 0:
        return float("nan")
    table = no_exceed_table(N, m)
    if counts is None:
        return float(np.mean(1.0 - table[e.sum(1)]))
    c = np.asarray(counts, dtype=np.int64)
    if int(c.reshape(-1, N).sum(1).max()) != N or int(c.reshape(-1, N).sum(1).min()) != N:
        raise ValueError("every resample must draw exactly N sequences")
    K = c @ e.T.astype(np.int64)  # [B, P] or [P]
    shares: np.ndarray | float = np.mean(1.0 - table[K], axis=-1)
    return shares


def jackknife_max_shares(exceed: np.ndarray, m: int) -> np.ndarray:
    """[N] delete-one replicates of `subsampled_share`: sequence j left out, m of the remaining N − 1."""
    e = np.asarray(exceed, dtype=bool)
    N = e.shape[1]
    table = no_exceed_table(N - 1, min(m, N - 1))
    k = e.sum(1)
    reps: np.ndarray = np.mean(1.0 - table[k[:, None] - e.astype(np.int64)], axis=0)
    return reps


def jackknife_interval(
    estimate: float,
    replicates: np.ndarray,
    *,
    level: float = LEVEL,
    method: str = JACKKNIFE_T,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> Interval:
    """estimate ± t_{N−1}·SE_jack, SE_jack² = (N−1)/N Σ_j (θ_(j) − θ_(·))², clipped to `bounds`.

    For a symmetric statistic the jackknife variance is biased upward in expectation (Efron–Stein); a single
    estimate can still fall below the true variance."""
    r = np.asarray(replicates, dtype=np.float64).ravel()
    N = r.size
    if not np.isfinite(estimate) or N < 2 or not np.isfinite(r).all():
        return Interval(float(estimate), float("nan"), float("nan"), method, SEQUENCES, N, level)
    se = float(np.sqrt((N - 1) / N * np.square(r - r.mean()).sum()))
    lo, hi = _clip(float(estimate), float(_sps.t.ppf((1 + level) / 2, N - 1)) * se, bounds)
    return Interval(float(estimate), lo, hi, method, SEQUENCES, N, level)


def max_share_interval(
    exceed: np.ndarray, m: int | None = None, *, level: float = LEVEL
) -> tuple[Interval, np.ndarray, int]:
    """(interval of the size-fixed share at m sequences, its delete-one jackknife replicates [N], m).

    Paired comparisons (two checkpoints on the same sequences, trained vs untrained) difference the
    replicates of both sides: `paired_difference(..., jackknife=True)`."""
    e = np.asarray(exceed, dtype=bool)
    N = e.shape[1]
    m = default_subsample(N) if m is None else int(m)
    est = subsampled_share(e, m)
    method = f"{SUBSAMPLED}, m = {m} of {N} sequences; {JACKKNIFE_T}"
    if N < 2:
        return Interval(float(est), float("nan"), float("nan"), method, SEQUENCES, N, level), np.empty(0), m
    reps = jackknife_max_shares(e, m)
    return jackknife_interval(est, reps, level=level, method=method), reps, m


# ---------------------------------------------------------------------------------------------------------------
# shares of ratios of per-sequence sums (causal mean / pooled, permutation)


@overload
def ratio_share(num: np.ndarray, den: np.ndarray, theta: float, counts: None = None) -> float: ...
@overload
def ratio_share(num: np.ndarray, den: np.ndarray, theta: float, counts: np.ndarray) -> np.ndarray | float: ...
def ratio_share(num: np.ndarray, den: np.ndarray, theta: float, counts: np.ndarray | None = None) -> np.ndarray | float:
    """Share of late pairs with Σ_n c_n·num[p, n] / Σ_n c_n·den[p, n] > θ (strict); c = 1 without counts.

    num, den: [P, N]; counts: None, [N] or [B, N]. Pairs with a zero denominator do not exceed θ.
    """
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 2:
        raise ValueError(f"num and den must be equal [P, N] arrays, got {num.shape}, {den.shape}")
    if num.shape[0] == 0:
        return float("nan")
    c = np.ones(num.shape[1]) if counts is None else np.asarray(counts, dtype=np.float64)
    a, b = c @ num.T, c @ den.T
    with np.errstate(invalid="ignore", divide="ignore"):
        above = np.where(b > 0, a / np.where(b > 0, b, 1.0), -np.inf) > theta
    out = above.mean(-1)
    return float(out) if counts is None or np.ndim(counts) == 1 else out


def ratio_share_interval(
    num: np.ndarray,
    den: np.ndarray,
    theta: float,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    counts: np.ndarray | None = None,
) -> tuple[Interval, np.ndarray]:
    """(interval of `ratio_share` from a bootstrap over sequences, replicates [B])."""
    N = np.shape(num)[1]
    est = ratio_share(num, den, theta)
    if n_boot < 1 or N < 2:
        return Interval(float(est), float("nan"), float("nan"), NORMAL_BOOT, SEQUENCES, N, level), np.empty(0)
    c = bootstrap_counts(N, n_boot, seed) if counts is None else counts
    reps = np.asarray(ratio_share(num, den, theta, c))
    return normal_interval(est, reps, level=level, n_units=N), reps


def paired_difference(
    est_a: float,
    est_b: float,
    reps_a: np.ndarray,
    reps_b: np.ndarray,
    *,
    level: float = LEVEL,
    jackknife: bool = False,
    method: str | None = None,
    bounds: tuple[float, float] = (-1.0, 1.0),
    n_units: int | None = None,
) -> Interval:
    """a − b with its paired interval: both sides recomputed on the same resamples (bootstrap) or with the same
    sequence left out (jackknife replicates), so what the two share cancels. n_units: the sequences the
    bootstrap resampled (its replicates, one per resample, do not say how many)."""
    ra, rb = np.asarray(reps_a, dtype=np.float64), np.asarray(reps_b, dtype=np.float64)
    if ra.shape != rb.shape:
        raise ValueError(f"paired replicates must have one shape, got {ra.shape}, {rb.shape}")
    if jackknife:
        return jackknife_interval(
            est_a - est_b, ra - rb, level=level, bounds=bounds, method=f"paired {method or JACKKNIFE_T}"
        )
    return normal_interval(
        est_a - est_b,
        ra - rb,
        level=level,
        method=f"paired {method or NORMAL_BOOT}",
        unit=SEQUENCES,
        n_units=n_units if n_units is not None else int(np.shape(ra)[-1]) if ra.ndim > 1 else 0,
        bounds=bounds,
    )


def mean_interval(
    values: np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    counts: np.ndarray | None = None,
    bounds: tuple[float, float] = (-np.inf, np.inf),
) -> tuple[Interval, np.ndarray]:
    """Mean of per-sequence values [N] (e.g. a loss) with its bootstrap interval over sequences, replicates."""
    v = np.asarray(values, dtype=np.float64)
    N = v.size
    est = float(v.mean())
    if n_boot < 1 or N < 2:
        return Interval(est, float("nan"), float("nan"), NORMAL_BOOT, SEQUENCES, N, level), np.empty(0)
    c = bootstrap_counts(N, n_boot, seed) if counts is None else counts
    reps = (c @ v) / N
    return normal_interval(est, reps, level=level, n_units=N, bounds=bounds), reps


# ---------------------------------------------------------------------------------------------------------------
# training seeds


def t_interval(
    values: Sequence[float],
    *,
    level: float = LEVEL,
    bounds: tuple[float, float] = (-np.inf, np.inf),
    method: str = STUDENT_T,
) -> Interval:
    """Mean of per-seed estimates ± t_{n−1}·sd/√n (ddof=1), clipped to `bounds`; NaN interval for n < 2."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    n = v.size
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), method, SEEDS, 0, level)
    est = float(v.mean())
    if n < 2:
        return Interval(est, float("nan"), float("nan"), method, SEEDS, n, level)
    half = float(_sps.t.ppf((1 + level) / 2, n - 1)) * float(v.std(ddof=1)) / np.sqrt(n)
    lo, hi = _clip(est, half, bounds)
    return Interval(est, lo, hi, method, SEEDS, n, level)


def paired_t_interval(
    a: Sequence[float], b: Sequence[float], *, level: float = LEVEL, bounds: tuple[float, float] = (-np.inf, np.inf)
) -> Interval:
    """Mean of per-seed differences a_s − b_s (the same seeds, scored on the same eval sequences)."""
    if len(a) != len(b):
        raise ValueError(f"paired seeds: {len(a)} vs {len(b)} values")
    return t_interval([x - y for x, y in zip(a, b)], level=level, bounds=bounds, method=PAIRED_T)


def welch_interval(a: Sequence[float], b: Sequence[float], *, level: float = LEVEL) -> Interval:
    """mean(a) − mean(b) for two independent sets of runs, Welch–Satterthwaite t; NaN interval if either has
    fewer than 2 values."""
    x = np.asarray([v for v in a if v is not None and np.isfinite(v)], dtype=np.float64)
    y = np.asarray([v for v in b if v is not None and np.isfinite(v)], dtype=np.float64)
    n = min(x.size, y.size)
    if x.size == 0 or y.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), WELCH_T, SEEDS, n, level)
    est = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return Interval(est, float("nan"), float("nan"), WELCH_T, SEEDS, n, level)
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = float(np.sqrt(va + vb))
    if se == 0:
        return Interval(est, est, est, WELCH_T, SEEDS, n, level)
    df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    half = float(_sps.t.ppf((1 + level) / 2, df)) * se
    return Interval(est, est - half, est + half, WELCH_T, SEEDS, n, level)


# ---------------------------------------------------------------------------------------------------------------
# share against eval-set size


def nested_sizes(n: int, fractions: Sequence[float] = (1 / 8, 1 / 4, 1 / 2, 1.0)) -> list[int]:
    """Prefix sizes ⌈f·n⌉ (at least 1, unique, ascending) of the eval set."""
    return sorted({max(1, int(np.ceil(f * n - 1e-9))) for f in fractions})


def prefix_counts(n: int, sizes: Sequence[int]) -> np.ndarray:
    """[len(sizes), n] 0/1 weights: the first `size` sequences."""
    return (np.arange(n)[None, :] < np.asarray(sizes)[:, None]).astype(np.int64)


def still_rising(sizes: Sequence[int], shares: Sequence[float] | np.ndarray, tol: float = RISING_TOL) -> bool:
    """Whether the share grew by more than `tol` between the prefix of half the largest size (or the one before
    the largest) and the whole eval set."""
    s = np.asarray(shares, dtype=np.float64)
    if s.size < 2 or not np.isfinite(s[-2:]).all():
        return False
    return bool(s[-1] - s[-2] > tol)


def prefix_max_shares(exceed: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """[len(sizes)]: the ordinary max share (some sequence exceeds θ) on each prefix of the eval set."""
    e = np.asarray(exceed, dtype=np.int64)
    shares: np.ndarray = ((prefix_counts(e.shape[1], sizes) @ e.T) > 0).mean(-1)
    return shares

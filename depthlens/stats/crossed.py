"""Intervals for a crossed seed × sequence design: every training seed is scored on the same eval sequences.

A design's value at one depth is the mean over its S training runs of a statistic T_s that each run gets on the
*same* N eval sequences. Write T_s = μ + a_s + b + e_s: a_s the run's own effect (training), b the error the
shared sequences put into every run alike, e_s the run × sequence interaction. Then

    Var(T̄) = σ_a²/S + σ_b² + σ_e²/S.

The between-seed spread s² of the T_s estimates σ_a² + σ_e² only: b is common to all runs and cancels from
their differences. A Student t interval over seeds (the "nested" method, as if each run had its own
sequences) therefore misses σ_b², the part of the eval noise every run shares; it undercovers whenever the
sequences matter (tests/test_crossed.py measures it).

**Method: the two-way crossed random-effects variance decomposition** (the ANOVA / method-of-moments
estimator of the grand mean's variance, Searle, Casella & McCulloch 1992, *Variance Components*, ch. 4; the
same decomposition Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2), derives for crossed
resampling; McCullagh 2000, "Resampling and exchangeable arrays", Bernoulli 6(2), shows no bootstrap is exact
for crossed designs, so the moment estimator is used), with **Satterthwaite (1946) degrees of freedom** for
its t interval. For a mean of per-sequence values Y[s, n] it is exactly

    V̂ = (MS_seed + MS_seq − MS_error) / (S N)        (the expected mean squares of the two-way layout)

and it is computed here from three pieces that also exist for a non-linear statistic (a share), whose
sequence-level variability comes from replicates over the *same* resamples of the sequences for every run
(delete-one jackknife, or bootstrap with shared counts):

* A = s²/S, the between-seed variance of the T_s over S (df S − 1);
* B = the sequence-resampling variance of the seed mean's replicate, estimating σ_b² + σ_e²/S (df N − 1);
* E = (mean_s V_s − B)/(S − 1), V_s a run's own sequence variance: the σ_e²/S that A and B both hold
  (df (S − 1)(N − 1)).

V̂ = A + max(B − E, 0). A contrast between designs (a difference of their seed means, all on the same
sequences) sums A and E over its groups with weights w² and takes B of the contrast's replicate, so what the
designs' sequences share cancels. With one seed in a group no training variance can be estimated and there
is no interval (callers report the sequence-level one and say so).

Coverage at the sizes the zoo report uses (`COVERAGE`, simulated by `coverage`, rechecked by the tests) is
stated beside an interval wherever it falls short of 90 %. `plan` turns the same components into the seeds
and sequences a difference needs for a given power.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _sps

from .intervals import LEVEL, SEEDS, Interval

CROSSED = "two-way crossed random effects (seed × sequence), moment estimator, Satterthwaite t"
JACKKNIFE, BOOTSTRAP = "jackknife", "bootstrap"
SHORTFALL = 0.90  # below this simulated coverage the report states the coverage beside the interval


@dataclass(frozen=True)
class Group:
    """One design at one depth: per-run estimates [S] and per-run replicates [S, R] over the same resamples of
    the shared sequences (R = N delete-one jackknife replicates, or R bootstrap resamples with shared counts)."""

    estimates: np.ndarray
    replicates: np.ndarray

    @classmethod
    def of(cls, estimates: Sequence[float], replicates: Sequence[Sequence[float]] | np.ndarray) -> Group:
        e = np.asarray(estimates, dtype=np.float64).ravel()
        r = np.asarray(replicates, dtype=np.float64)
        if r.ndim != 2 or r.shape[0] != e.size:
            raise ValueError(f"replicates must be [S, R] with S = {e.size} runs, got {r.shape}")
        return cls(e, r)

    @classmethod
    def of_means(cls, values: np.ndarray) -> Group:
        """A statistic that is the mean of per-sequence values Y [S, N]: its estimates and jackknife replicates."""
        y = np.asarray(values, dtype=np.float64)
        if y.ndim != 2 or y.shape[1] < 2:
            raise ValueError(f"per-sequence values must be [S, N] with N >= 2, got {y.shape}")
        N = y.shape[1]
        return cls(y.mean(1), (y.sum(1, keepdims=True) - y) / (N - 1))


@dataclass(frozen=True)
class Components:
    """The pieces of V̂ (see the module docstring), each with its degrees of freedom."""

    seed: float  # A: between-seed part (training runs, with the run × sequence interaction)
    sequence: float  # B − E, truncated at 0: the part of the eval noise every run shares
    interaction: float  # E
    replicate: float  # B: sequence-resampling variance of the (contrast's) seed mean
    n_seeds: tuple[int, ...]
    n_sequences: int
    df: float
    seed_parts: tuple[float, ...]  # per group: w² s²/S, s² the runs' spread (σ_a² + σ_e²)
    interaction_parts: tuple[float, ...]  # per group: w² σ_e²/S

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Components:
        """The inverse of `as_dict` (a report's JSON row)."""
        return cls(
            seed=float(d["seed"]),
            sequence=float(d["sequence"]),
            interaction=float(d["interaction"]),
            replicate=float(d["replicate"]),
            n_seeds=tuple(int(x) for x in d["n_seeds"]),
            n_sequences=int(d["n_sequences"]),
            df=float(d["df"]),
            seed_parts=tuple(float(x) for x in d["seed_parts"]),
            interaction_parts=tuple(float(x) for x in d["interaction_parts"]),
        )

    @property
    def variance(self) -> float:
        return self.seed + self.sequence

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "sequence": self.sequence,
            "interaction": self.interaction,
            "replicate": self.replicate,
            "n_seeds": list(self.n_seeds),
            "n_sequences": self.n_sequences,
            "df": self.df,
            "seed_parts": list(self.seed_parts),
            "interaction_parts": list(self.interaction_parts),
        }


def _rep_var(r: np.ndarray, kind: str) -> np.ndarray:
    """Variance over the last axis of replicates: jackknife (N−1)/N Σ(r − r̄)², or the bootstrap sample variance."""
    if kind == JACKKNIFE:
        n = r.shape[-1]
        out: np.ndarray = (n - 1) / n * np.square(r - r.mean(-1, keepdims=True)).sum(-1)
        return out
    if kind == BOOTSTRAP:
        return np.asarray(r.var(-1, ddof=1))
    raise ValueError(f"replicates are {JACKKNIFE!r} or {BOOTSTRAP!r}, got {kind!r}")


def components(
    groups: Sequence[Group],
    weights: Sequence[float] | np.ndarray | None = None,
    *,
    kind: str = JACKKNIFE,
    n_sequences: int = 0,
) -> Components | None:
    """The variance components of Σ_g w_g T̄_g (default: one group, w = 1). None when a group has < 2 runs.
    n_sequences: N for a bootstrap (the jackknife's is its replicate count)."""
    w = np.ones(len(groups)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != len(groups) or not groups:
        raise ValueError("one weight per group")
    R = {g.replicates.shape[1] for g in groups}
    if len(R) != 1:
        raise ValueError(f"every group needs replicates over the same resamples, got counts {sorted(R)}")
    N = R.pop() if kind == JACKKNIFE else int(n_sequences)
    if N < 2:
        raise ValueError("need at least 2 sequences")
    S = [g.estimates.size for g in groups]
    if min(S) < 2:
        return None
    seed_var = [float(g.estimates.var(ddof=1)) for g in groups]
    run_var = [float(_rep_var(g.replicates, kind).mean()) for g in groups]
    grp_rep_var = [float(_rep_var(g.replicates.mean(0), kind)) for g in groups]
    A_parts = [wi**2 * v / s for wi, v, s in zip(w, seed_var, S)]
    E_parts = [wi**2 * max(rv - gb, 0.0) / (s - 1) for wi, rv, gb, s in zip(w, run_var, grp_rep_var, S)]
    contrast = sum(wi * g.replicates.mean(0) for wi, g in zip(w, groups))
    B = float(_rep_var(np.asarray(contrast), kind))
    A, E = float(sum(A_parts)), float(sum(E_parts))
    shared = max(B - E, 0.0)
    # Satterthwaite: V̂ as a signed sum of independent mean squares, each with its df
    terms = [(a, s - 1) for a, s in zip(A_parts, S)]
    if shared > 0:
        terms += [(B, N - 1)] + [(e, (s - 1) * (N - 1)) for e, s in zip(E_parts, S)]
    V = A + shared
    denom = sum(t**2 / d for t, d in terms if d > 0)
    df = V**2 / denom if denom > 0 else float("inf")
    return Components(
        A, shared, E, B, tuple(S), N, float(df), tuple(float(a) for a in A_parts), tuple(float(e) for e in E_parts)
    )


def crossed_interval(
    groups: Sequence[Group],
    weights: Sequence[float] | np.ndarray | None = None,
    *,
    kind: str = JACKKNIFE,
    n_sequences: int = 0,
    level: float = LEVEL,
    bounds: tuple[float, float] = (-np.inf, np.inf),
) -> tuple[Interval, Components | None]:
    """Σ_g w_g T̄_g ± t_df √V̂ (clipped to `bounds`), with its components; a NaN interval when a group has one run."""
    w = np.ones(len(groups)) if weights is None else np.asarray(weights, dtype=np.float64)
    est = float(sum(wi * g.estimates.mean() for wi, g in zip(w, groups)))
    n = min(g.estimates.size for g in groups)
    comp = components(groups, w, kind=kind, n_sequences=n_sequences)
    if comp is None:
        return Interval(est, float("nan"), float("nan"), CROSSED, SEEDS, n, level), None
    half = float(_sps.t.ppf((1 + level) / 2, comp.df)) * float(np.sqrt(comp.variance)) if comp.variance > 0 else 0.0
    lo, hi = max(est - half, bounds[0]), min(est + half, bounds[1])
    return Interval(est, lo, hi, CROSSED, SEEDS, n, level), comp


# ---------------------------------------------------------------------------------------------------------------
# power planning


def projected_variance(comp: Components, n_seeds: int, n_sequences: int) -> float:
    """V̂ projected to S runs per group and N sequences: per group, the run effect σ_a² = s² − σ_e² scales as 1/S,
    the run × sequence interaction σ_e² as 1/(S N), the shared sequence part as 1/N (exact for a mean of
    per-sequence values; for a share, a linearisation)."""
    N0, N, S = comp.n_sequences, n_sequences, n_seeds
    out = comp.sequence * N0 / N
    for s0, a, e in zip(comp.n_seeds, comp.seed_parts, comp.interaction_parts):
        # a = w² s²/S₀ and e = w² σ_e²/S₀: per run, w² s² = a S₀ and w² σ_e² = e S₀
        run, inter = a * s0, min(e * s0, a * s0)
        out += (run - inter) / S + inter * N0 / N / S
    return float(max(out, 0.0))


def planned_df(comp: Components, n_seeds: int, n_sequences: int) -> float:
    """Satterthwaite df of the projected V̂: each group's seed part with S − 1 df, the shared part with N − 1."""
    S, N = n_seeds, n_sequences
    terms = [(a * s0 / S, S - 1) for s0, a in zip(comp.n_seeds, comp.seed_parts)]
    B = comp.sequence * comp.n_sequences / N
    if B > 0:
        terms.append((B, N - 1))
    V = sum(t for t, _ in terms)
    denom = sum(t**2 / d for t, d in terms if d > 0)
    return float(V**2 / denom) if denom > 0 else float("inf")


def power(delta: float, variance: float, df: float, level: float = LEVEL) -> float:
    """P(the two-sided `level` t interval excludes 0) when the true difference is `delta`: noncentral t."""
    if variance <= 0:
        return 1.0 if delta != 0 else 1 - level
    nc = abs(delta) / np.sqrt(variance)
    t = _sps.t.ppf((1 + level) / 2, df)
    p = float(_sps.nct.sf(t, df, nc) + _sps.nct.cdf(-t, df, nc))
    if not np.isfinite(p):  # far in the tail the noncentral t's series fails: its normal limit
        p = float(_sps.norm.sf(t - nc) + _sps.norm.cdf(-t - nc))
    return min(max(p, 0.0), 1.0)


def plan(
    comp: Components,
    delta: float,
    *,
    target: float = 0.8,
    level: float = LEVEL,
    max_seeds: int = 256,
    sequences: Sequence[int] | None = None,
) -> dict[str, Any]:
    """How many runs per design (at the current number of eval sequences, and at each of `sequences`) give
    `target` power to resolve a true difference `delta` with the crossed interval; the power at the current
    size; and whether more seeds alone cannot do it (the shared sequence part is left however many runs)."""
    N0 = comp.n_sequences
    Ns = sorted({N0, *(sequences if sequences is not None else (2 * N0, 4 * N0))})

    def pw(S: int, N: int) -> float:
        return power(delta, projected_variance(comp, S, N), planned_df(comp, S, N), level)

    S0 = min(comp.n_seeds)
    return {
        "delta": float(delta),
        "target": target,
        "power_now": pw(S0, N0),
        "seeds_needed": {str(N): next((S for S in range(2, max_seeds + 1) if pw(S, N) >= target), None) for N in Ns},
        "sequence_sd_now": float(np.sqrt(comp.sequence)),
    }


# ---------------------------------------------------------------------------------------------------------------
# simulation: coverage at the report's sizes and power with known truth

# variance scenarios (sd of the run effect, of the shared sequence effect, of the run × sequence interaction):
# "zoo" has the sequence part as large as the run part (the Pre-LN L = 32 situation: the shared-sequence SE of
# the seed mean is ~0.6x the t SE), "sequences" is dominated by the shared sequences (the nested t fails there)
SCENARIOS = {"zoo": (1.0, 1.0, 1.0), "sequences": (0.3, 1.5, 0.5), "seeds": (1.5, 0.3, 0.5), "one_run": (0.0, 1.0, 1.0)}
KINDS = ("mean", "causal", "perm")  # a mean of per-sequence values; the causal max share; the permutation share


def _seed_effects(rng: np.random.Generator, S: int, sd: float, dist: str) -> np.ndarray:
    if dist == "normal":
        return rng.normal(0.0, sd, S)
    if dist == "bimodal":  # two runs low, one high in three (HC at L = 32: 0.18 / 0.29 / 0.76); mean 0, sd `sd`
        high = rng.random(S) < 1 / 3
        out: np.ndarray = (np.where(high, 2.0, -1.0) / np.sqrt(2.0) + rng.normal(0.0, 0.1, S)) * sd
        return out
    raise ValueError(f"seed distribution is 'normal' or 'bimodal', got {dist!r}")


def simulate(
    rng: np.random.Generator,
    kind: str,
    S: int,
    N: int,
    scenario: str = "zoo",
    seeds: str = "normal",
    *,
    n_boot: int = 200,
    pairs: int = 24,
) -> Group:
    """One simulated design: S runs on the same N sequences, as the estimates and replicates the report builds.

    mean:   Y[s, n] = a_s + b_n + e_sn, the statistic its row mean (jackknife replicates); truth 0.
    causal: per late pair p a value a_sp + b_pn + e_spn (pair offsets spread the shares), exceed = value > 0.45,
            the size-fixed share at m = N/2 (`intervals.subsampled_share`, jackknife replicates).
    perm:   per pair a positive cost exp(a_sp + b_pn + e_spn − 2), the share of pairs whose mean cost > 0.15
            (`intervals.ratio_share`, bootstrap replicates on counts every run shares)."""
    from . import intervals as iv

    sa, sb, se = SCENARIOS[scenario]
    if kind == "mean":
        y = _seed_effects(rng, S, sa, seeds)[:, None] + rng.normal(0, sb, N)[None, :] + rng.normal(0, se, (S, N))
        return Group.of_means(y)
    offs = np.linspace(-1.0, 1.0, pairs)
    a = 0.25 * _seed_effects(rng, S, sa, seeds)[:, None] + offs[None, :]  # [S, P]
    b = 0.25 * (rng.normal(0, sb, (pairs, N)) + rng.normal(0, sb, N)[None, :])  # shared: pair and whole-sequence
    v = a[:, :, None] + b[None] + 0.25 * rng.normal(0, se, (S, pairs, N))  # [S, P, N]
    if kind == "causal":
        m = iv.default_subsample(N)
        ex = v > 0.45 - 0.5
        est = [iv.subsampled_share(ex[s], m) for s in range(S)]
        return Group.of(est, np.stack([iv.jackknife_max_shares(ex[s], m) for s in range(S)]))
    if kind == "perm":
        cost = np.exp(v - 2.0)
        den = np.ones_like(cost[0])
        counts = iv.bootstrap_counts(N, n_boot, int(rng.integers(1 << 31)))
        est = [iv.ratio_share(cost[s], den, 0.15) for s in range(S)]
        return Group.of(est, np.stack([np.asarray(iv.ratio_share(cost[s], den, 0.15, counts)) for s in range(S)]))
    raise ValueError(f"kind is one of {KINDS}, got {kind!r}")


@functools.lru_cache(maxsize=64)
def truth(kind: str, N: int, scenario: str = "zoo", seeds: str = "normal", draws: int = 4000, seed: int = 1) -> float:
    """E[T] of one run on N fresh sequences (the seed mean's expectation), by Monte Carlo (mean: exactly 0)."""
    if kind == "mean":
        return 0.0
    rng = np.random.default_rng(seed)
    return float(np.mean([simulate(rng, kind, 1, N, scenario, seeds, n_boot=2).estimates[0] for _ in range(draws)]))


def nested_interval(group: Group, level: float = LEVEL) -> Interval:
    """The method the crossed one replaces: Student t over the runs' estimates, as if each had its own sequences."""
    from .intervals import t_interval

    return t_interval(group.estimates.tolist(), level=level)


def sequence_coverage(kind: str, N: int, *, sims: int = 400, seed: int = 0, n_boot: int = 1000) -> float:
    """Coverage of one checkpoint's own interval over eval sequences (the report's per-checkpoint columns: the
    causal share's delete-one jackknife t, the permutation share's normal interval with a bootstrap SE), for a
    run held fixed ('one_run': only the sequences vary)."""
    from . import intervals as iv

    rng = np.random.default_rng(seed)
    mu = truth(kind, N, "one_run")
    hit = 0
    for _ in range(sims):
        g = simulate(rng, kind, 1, N, "one_run", n_boot=n_boot)
        e, r = float(g.estimates[0]), g.replicates[0]
        it = iv.jackknife_interval(e, r) if kind == "causal" else iv.normal_interval(e, r, n_units=N)
        hit += bool(it.low <= mu <= it.high)
    return hit / sims


def coverage(
    kind: str,
    S: int,
    N: int,
    scenario: str = "zoo",
    seeds: str = "normal",
    *,
    sims: int = 400,
    seed: int = 0,
    method: str = "crossed",
    level: float = LEVEL,
) -> float:
    """Share of `sims` simulated designs whose interval (crossed or nested) covers the truth."""
    rng = np.random.default_rng(seed)
    mu = truth(kind, N, scenario, seeds)
    kind_of = BOOTSTRAP if kind == "perm" else JACKKNIFE
    hit = 0
    for _ in range(sims):
        g = simulate(rng, kind, S, N, scenario, seeds)
        if method == "crossed":
            it, _ = crossed_interval([g], kind=kind_of, n_sequences=N, level=level)
        elif method == "nested":
            it = nested_interval(g, level)
        else:
            raise ValueError(f"method is 'crossed' or 'nested', got {method!r}")
        hit += bool(it.low <= mu <= it.high)
    return hit / sims


# simulated coverage of the 95 % crossed interval (1000 designs each, `coverage(..., sims=1000, seed=7)`), keyed
# "kind/S/N/scenario/seed distribution" at the zoo report's sizes: N = 16 sequences (mean, causal), 4 (perm; the
# zoo report's size since issue 32's power check, docs/performance.md#the-main-job), and 8 (perm, the size before)
COVERAGE: dict[str, float] = {
    "mean/3/16/zoo/normal": 0.931,
    "mean/3/16/sequences/normal": 0.953,
    "mean/3/16/seeds/bimodal": 0.691,
    "mean/5/16/zoo/normal": 0.932,
    "mean/5/16/sequences/normal": 0.943,
    "mean/5/16/seeds/bimodal": 0.854,
    "mean/8/16/zoo/normal": 0.95,
    "mean/8/16/sequences/normal": 0.954,
    "mean/8/16/seeds/bimodal": 0.948,
    "causal/3/16/zoo/normal": 0.925,
    "causal/3/16/sequences/normal": 0.937,
    "causal/3/16/seeds/bimodal": 0.662,
    "causal/5/16/zoo/normal": 0.931,
    "causal/5/16/sequences/normal": 0.908,
    "causal/5/16/seeds/bimodal": 0.861,
    "causal/8/16/zoo/normal": 0.944,
    "causal/8/16/sequences/normal": 0.915,
    "causal/8/16/seeds/bimodal": 0.939,
    "perm/3/8/zoo/normal": 0.94,
    "perm/3/8/sequences/normal": 0.922,
    "perm/3/8/seeds/bimodal": 0.734,
    "perm/5/8/zoo/normal": 0.957,
    "perm/5/8/sequences/normal": 0.941,
    "perm/5/8/seeds/bimodal": 0.866,
    "perm/8/8/zoo/normal": 0.932,
    "perm/8/8/sequences/normal": 0.925,
    "perm/8/8/seeds/bimodal": 0.947,
    "perm/3/4/zoo/normal": 0.968,
    "perm/3/4/sequences/normal": 0.934,
    "perm/3/4/seeds/bimodal": 0.775,
    "perm/5/4/zoo/normal": 0.951,
    "perm/5/4/sequences/normal": 0.931,
    "perm/5/4/seeds/bimodal": 0.846,
    "perm/8/4/zoo/normal": 0.925,
    "perm/8/4/sequences/normal": 0.93,
    "perm/8/4/seeds/bimodal": 0.944,
    # one checkpoint's own interval over sequences (`sequence_coverage(..., sims=600, seed=2)`)
    "causal/1/16/one_run/normal": 0.917,
    "perm/1/8/one_run/normal": 0.883,
    "causal/1/32/one_run/normal": 0.93,
    "perm/1/16/one_run/normal": 0.902,
    "perm/1/4/one_run/normal": 0.835,
}


def coverage_note(kind: str, n_seeds: int, n_sequences: int) -> str | None:
    """What to print beside a crossed interval whose simulated coverage at its size falls short of 90 %: the
    coverage with normal run effects (the worse of the 'zoo' and 'sequences' scenarios) and with a bimodal run
    distribution. None when both reach 90 % (sizes between the tabulated ones read the next smaller S)."""
    sizes = sorted({int(k.split("/")[1]) for k in COVERAGE if k.startswith(f"{kind}/") and k.split("/")[3] == "zoo"})
    below = [k for k in sizes if k <= n_seeds]
    if not below:
        return f"coverage not simulated at {n_seeds} seeds"
    S = below[-1]
    normal = [COVERAGE.get(f"{kind}/{S}/{n_sequences}/{sc}/normal") for sc in ("zoo", "sequences")]
    bimodal = COVERAGE.get(f"{kind}/{S}/{n_sequences}/seeds/bimodal")
    if any(v is None for v in normal) or bimodal is None:
        return f"coverage not simulated at {n_sequences} sequences"
    worst = min(v for v in normal if v is not None)
    if worst >= SHORTFALL and bimodal >= SHORTFALL:
        return None
    size = f"{S} seeds x {n_sequences} sequences"
    parts = []
    if worst < SHORTFALL:
        parts.append(f"{round(100 * worst)} % with normal run effects")
    parts.append(f"{round(100 * bimodal)} % if the runs are bimodal")
    return f"simulated coverage of this 95 % interval at {size}: " + "; ".join(parts)


def sequence_coverage_note(n_causal: int, n_perm: int) -> str:
    """One sentence on the per-checkpoint sequence intervals' simulated coverage at these sizes (the table's
    `one_run` entries), naming a shortfall below 90 %; sizes not simulated are said to be."""
    parts = []
    for kind, n, what in (("causal", n_causal, "causal"), ("perm", n_perm, "permutation")):
        cov = COVERAGE.get(f"{kind}/1/{n}/one_run/normal")
        if cov is None:
            parts.append(f"{what} at {n} sequences: not simulated")
        else:
            short = " (short of nominal)" if cov < SHORTFALL else ""
            parts.append(f"{what} at {n} sequences: {round(100 * cov)} %{short}")
    return "Simulated coverage of these per-checkpoint 95 % intervals: " + "; ".join(parts) + "."

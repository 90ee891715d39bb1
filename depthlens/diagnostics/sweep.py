"""Threshold sweeps, variants, robustness and uncertainty of the late-window shares (docs/concepts.md#thresholds).

    S_X(θ) = (1/|P|) Σ_{(i,j) ∈ P} 1[X(i, j) > θ],   P = {(i, j): a ≤ i < j ≤ L−1}, a = ⌊L/4⌋ by default

Inputs are the Datasets of `causal.causal_scores` (metric "causal" → `causal_score`, "direct" →
`direct_score`) and `permutation.permutation_scores` ("perm_abs", "perm_rel", "perm_kl"), optionally stacked
along `checkpoint`. Bootstrap CIs resample sequences and recompute the whole aggregation inside every
resample, including the max, from the per-sequence summaries the engines store (`seq_max`, `seq_sum`, ...,
`delta_loss_seq`, `kl_seq`), so a resample costs a few array reductions.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.io.dataset import LAYER_DIMS, data_var
from depthlens.stats.metrics import late_pairs, late_window
from depthlens.stats.shares import PerSequence, bootstrap_ci, crossing_points, ranking_robustness, share_curve

if TYPE_CHECKING:
    from depthlens.stats.intervals import Interval

WINDOW_STARTS = ("zero", "quarter", "half")
CROSSING_QS = (0.5, 0.25, 0.1, 0.01)


def definition(
    metric: str,
    *,
    variant: str | None = None,
    aggregator: str | None = None,
    norm: str | None = None,
    swap: str | None = None,
) -> str:
    """One line naming what a headline measures: 'causal C(s,t): variant=current, aggregator=max, norm=update'
    (the score's `describe` hook words it; a score without one is its `definition`)."""
    score = registry.score(metric)
    if score.describe is None:
        return score.definition
    line: str = registry.resolve(score.describe)(score, variant=variant, aggregator=aggregator, norm=norm, swap=swap)
    return line


def default_thresholds(metric: str) -> np.ndarray:
    """The θ grid the registry declares for score `metric` (`Score.grid`): C on [0, 1.5] step 0.05; P_abs/P_KL
    log-spaced 0.005–2 nats; P_rel log-spaced 0.005–1."""
    g = registry.score(metric).grid
    if g.kind == "linear":
        return np.round(np.arange(g.start, g.stop + 1e-9, g.step), 10)
    return np.geomspace(g.start, g.stop, g.n)


def score_matrix(
    ds: xr.Dataset, metric: str, aggregator: str | None = "max", variant: str | None = "current"
) -> xr.DataArray:
    """The (…, layer, layer_other) score DataArray of `metric`, with aggregator/variant selected if present."""
    var = registry.score(metric).var
    if var not in ds:
        raise DepthlensError(
            f"dataset has no {var!r} variable (metric {metric!r}); it holds {sorted(str(v) for v in ds.data_vars)}"
        )
    da = ds[var]
    sel = {k: v for k, v in (("aggregator", aggregator), ("variant", variant)) if k in da.dims and v is not None}
    return da.sel(sel)


def _window_start(L: int, rule: str) -> int:
    return late_window(L, rule)


def _n_layer(ds: xr.Dataset, X: xr.DataArray, index: dict[Hashable, int]) -> int:
    """L of one matrix: the `n_layer` attr, or its per-checkpoint coordinate after `concat_checkpoints`."""
    if "n_layer" in ds.coords and ds["n_layer"].ndim == 1:
        dim = ds["n_layer"].dims[0]
        return int(ds["n_layer"].values[index.get(dim, 0)])
    if "n_layer" in ds.attrs:
        return int(ds.attrs["n_layer"])
    return int(X.sizes["layer"])


def share_curves(
    ds: xr.Dataset,
    metric: str,
    thresholds: Sequence[float] | np.ndarray | None = None,
    *,
    starts: Sequence[str] = WINDOW_STARTS,
    qs: Sequence[float] = CROSSING_QS,
    aggregator: str | None = None,
    variant: str | None = None,
) -> xr.Dataset:
    """S(θ) curves and crossing points θ_q for every window start and every remaining extra dim (checkpoint,
    variant, aggregator...). aggregator/variant None keep all of them (aggregator and variant sweeps).

    Returns a Dataset: `share` (…, window_start, threshold), `crossing` (…, window_start, q), with attrs
    `headline_threshold`. NaN late pairs (e.g. layers not computed) are omitted.
    """
    thetas = np.asarray(default_thresholds(metric) if thresholds is None else thresholds, dtype=float)
    X = score_matrix(ds, metric, aggregator, variant)
    extra = [d for d in X.dims if d not in LAYER_DIMS]
    X = X.transpose(*extra, *LAYER_DIMS)
    shape = tuple(X.sizes[d] for d in extra)
    S = np.full(shape + (len(starts), len(thetas)), np.nan)
    Q = np.full(shape + (len(starts), len(qs)), np.nan)
    vals = X.values
    for idx in np.ndindex(*shape):
        L = _n_layer(ds, X, dict(zip(extra, idx)))
        m = vals[idx][:L, :L]  # checkpoints of smaller L are NaN-padded by the outer join of xr.concat
        for k, rule in enumerate(starts):
            try:
                S[idx + (k,)] = share_curve(m, thetas, _window_start(L, rule), nan_policy="omit")
            except ValueError:  # fewer than 2 layers in the window
                continue
            Q[idx + (k,)] = crossing_points(thetas, S[idx + (k,)], qs)
    dims = (*extra, "window_start")
    coords = {d: X.coords[d] for d in extra if d in X.coords}
    out = xr.Dataset(
        {
            "share": data_var((*dims, "threshold"), S, f"share of late pairs with {metric} > threshold"),
            "crossing": data_var((*dims, "q"), Q, "threshold where the share falls to q"),
        },
        coords={**coords, "window_start": list(starts), "threshold": thetas, "q": list(qs)},
    )
    score = registry.score(metric)  # the threshold axis in the score's own symbol and unit (plots label with it)
    out["threshold"].attrs = {"long_name": f"threshold θ on {score.symbol}", "units": score.unit}
    out.attrs = {
        "metric": metric,
        "headline_threshold": score.theta,
        "window_start_rule": "zero = 0, quarter = floor(L/4), half = floor(L/2)",
        "comparison": "strict >",
    }
    return out


def robustness(
    curves: xr.DataArray, order: Sequence[str], headline_threshold: float | None = None, dim: str = "checkpoint"
) -> xr.Dataset:
    """Ranking robustness of share curves `curves` (dim, threshold): the fraction of the θ grid on which
    S_{order[0]} < S_{order[1]} < … holds, and Kendall τ of the ranking at each θ vs at the headline θ."""
    thetas = curves["threshold"].values
    named = {str(n): curves.sel({dim: n}).values for n in curves[dim].values}
    h = None if headline_threshold is None else int(np.argmin(np.abs(thetas - headline_threshold)))
    r = ranking_robustness(named, list(order), h)
    dv = {
        "holds": data_var(("threshold",), r.holds.astype(np.int8), "ordering holds at threshold"),
        "fraction": data_var((), r.fraction, "fraction of the grid where the ordering holds"),
    }
    if r.tau is not None:
        dv["kendall_tau"] = data_var(("threshold",), r.tau, "Kendall tau vs the ranking at the headline")
    return xr.Dataset(
        dv, coords={"threshold": thetas}, attrs={"order": " < ".join(order), "headline_threshold": headline_threshold}
    )


# ---------------------------------------------------------------------------------------------------------------
# bootstrap over sequences


def per_sequence(ds: xr.Dataset, metric: str, aggregator: str = "max", variant: str = "current") -> PerSequence | None:
    """Score `metric`'s matrix as per-sequence parts (`scores.PerSequence`): its own `per_sequence` hook, else the
    counted mean of its `seq_var`. None: not decomposable per sequence (causal p95/p99); DepthlensError: the
    Dataset lacks the parts."""
    score = registry.score(metric)
    if score.per_sequence is not None:
        parts: PerSequence | None = registry.resolve(score.per_sequence)(ds, aggregator, variant)
        return parts
    if score.seq_var is None or score.seq_var not in ds:
        raise DepthlensError(f"no per-sequence bootstrap for metric {metric!r}")
    return PerSequence("ratio", num=ds[score.seq_var].transpose(*LAYER_DIMS, "sequence").values)


def resampled_matrix(
    ds: xr.Dataset, metric: str, counts: np.ndarray, aggregator: str = "max", variant: str = "current"
) -> np.ndarray:
    """The [L, L] score matrix recomputed from per-sequence parts (`per_sequence`) with multiplicities `counts` [N].

    causal: max → max over drawn sequences of `seq_max`; mean → Σc·sum / Σc·count; pooled →
    sqrt(Σc·Δ² / Σc·u²). p95/p99 are not decomposable per sequence (NaN). permutation: counted means
    of `delta_loss_seq` / `kl_seq`, rel divided by the counted clean loss.
    """
    c = np.asarray(counts, dtype=float)
    parts = per_sequence(ds, metric, aggregator, variant)
    if parts is None:
        L = ds.sizes[LAYER_DIMS[0]]
        return np.full((L, L), np.nan)
    if parts.kind == "max":
        assert parts.values is not None
        drawn = parts.values[..., c > 0]
        # NaN where the engine's matrix is (t <= s: no measurement), as its per-sequence parts are
        return np.where(np.isnan(drawn).all(-1), np.nan, np.where(np.isnan(drawn), -np.inf, drawn).max(-1))
    assert parts.num is not None
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (parts.num @ c) / (c.sum() if parts.den is None else parts.den @ c)
    out: np.ndarray = np.sqrt(ratio) if parts.square else ratio
    return out


def bootstrap_share(
    ds: xr.Dataset,
    metric: str,
    threshold: float,
    *,
    aggregator: str = "max",
    variant: str = "current",
    start: str | int = "quarter",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, np.ndarray]:
    """Percentile CI of S(θ) over sequences (resample, recompute the matrix incl. the max, then the share)."""
    N = ds.sizes["sequence"]

    def stat(idx: np.ndarray) -> float:
        m = resampled_matrix(ds, metric, np.bincount(idx, minlength=N), aggregator, variant)
        return float(share_curve(m, [threshold], start, nan_policy="omit")[0])

    # stat is scalar, so the interval's ends are floats
    return cast("tuple[float, float, np.ndarray]", bootstrap_ci(stat, N, n_boot=n_boot, seed=seed, level=level))


def _share_of(
    ds: xr.Dataset, metric: str, threshold: float, seqs: range, aggregator: str, variant: str, start: str | int
) -> float:
    """S(θ) of the sequences `seqs` alone: the full aggregation (the max included) recomputed from them."""
    c = np.zeros(ds.sizes["sequence"])
    c[seqs.start : seqs.stop] = 1
    m = resampled_matrix(ds, metric, c, aggregator, variant)
    return float(share_curve(m, [threshold], start, nan_policy="omit")[0])


def shard_shares(
    ds: xr.Dataset,
    metric: str,
    threshold: float,
    k: int = 5,
    *,
    aggregator: str = "max",
    variant: str = "current",
    start: str | int = "quarter",
) -> xr.DataArray:
    """S(θ) on k disjoint, contiguous shards of the eval sequences (docs/concepts.md#thresholds: mean ± sd over shards).

    Each shard recomputes the full aggregation (the max included) from its own sequences only; the
    DataArray's attrs carry `mean` and `sd` (ddof=1).
    """
    N = ds.sizes["sequence"]
    if not 2 <= k <= N:
        raise DepthlensError(f"need 2 <= k <= number of sequences ({N}) shards, got k={k}")
    bounds = np.linspace(0, N, k + 1).round().astype(int)
    shards = [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    v = np.array([_share_of(ds, metric, threshold, seqs, aggregator, variant, start) for seqs in shards])
    return xr.DataArray(
        v,
        dims=("shard",),
        coords={"shard": np.arange(k)},
        name="share",
        attrs={
            "long_name": f"share of late pairs with {metric} > {threshold} per eval shard",
            "units": "1",
            "mean": float(v.mean()),
            "sd": float(v.std(ddof=1)),
            "shard_bounds_json": json.dumps(bounds.tolist()),
        },
    )


def eval_size_curve(
    ds: xr.Dataset,
    metric: str,
    threshold: float,
    sizes: Sequence[int] = (5, 10, 20, 40),
    *,
    aggregator: str = "max",
    variant: str = "current",
    start: str | int = "quarter",
) -> xr.DataArray:
    """S(θ) computed on the first N sequences, for each N ≤ the eval size (docs/concepts.md#thresholds: max grows with
    N)."""
    N = ds.sizes["sequence"]
    sizes = [s for s in sizes if s <= N] or [N]
    return xr.DataArray(
        np.array([_share_of(ds, metric, threshold, range(n), aggregator, variant, start) for n in sizes]),
        dims=("n_sequences",),
        coords={"n_sequences": sizes},
        name="share",
        attrs={"long_name": f"share of late pairs with {metric} > {threshold}", "units": "1"},
    )


def pair_arrays(
    ds: xr.Dataset, metric: str, aggregator: str = "max", variant: str = "current", start: str | int = "quarter"
) -> dict[str, Any] | None:
    """Per-sequence arrays [P, N] of the late pairs (those with a finite score) that a share's interval is computed
    from: {"kind": "max", "values": seq_max} or {"kind": "ratio", "num": ..., "den": ..., "square": ...};
    None when the score is not decomposable per sequence (p95, p99, direct)."""
    score = registry.score(metric)
    if "sequence" not in ds.dims or not score.bootstraps:
        return None
    selects = "aggregator" in score.select  # a score read with an aggregator and a variant (C)
    m = score_matrix(ds, metric, aggregator if selects else None, variant if selects else None)
    L = m.shape[0]
    pairs = late_pairs(L, late_window(L, start) if isinstance(start, str) else int(start))
    ok = np.isfinite(m.values[pairs[:, 0], pairs[:, 1]])
    i, j = pairs[ok, 0], pairs[ok, 1]
    try:
        parts = per_sequence(ds, metric, aggregator, variant)
    except DepthlensError:
        return None
    if parts is None:
        return None
    if parts.kind == "max":
        assert parts.values is not None
        return {"kind": "max", "values": parts.values[i, j]}
    assert parts.num is not None
    num = parts.num[i, j]
    den = np.ones_like(num) if parts.den is None else parts.den[i, j]
    if parts.fill:  # sums and counts: no measurement in a sequence adds nothing
        num, den = np.nan_to_num(num, nan=0.0), np.nan_to_num(den, nan=0.0)
    return {"kind": "ratio", "num": num, "den": den, "square": parts.square}


def share_interval(
    ds: xr.Dataset,
    metric: str,
    threshold: float,
    *,
    aggregator: str = "max",
    variant: str = "current",
    start: str | int = "quarter",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    subsample: int | None = None,
) -> tuple[Any, np.ndarray, bool, dict[str, Any]]:
    """(Interval of the headline share, its replicates, whether they are jackknife replicates, extras).

    max: the size-fixed share at m sequences (`intervals.max_share_interval`), jackknife replicates [N];
    ratio shares: the share at all N sequences, bootstrap replicates [n_boot] (resamples drawn from `seed`,
    so two datasets on the same sequences get the same resamples: a paired comparison).
    extras: share_full (the ordinary share at all N sequences), subsample_m, eval-size curve and the
    still-rising flag. Raises DepthlensError when the score has no per-sequence decomposition."""
    from depthlens.stats import intervals as iv

    arr = pair_arrays(ds, metric, aggregator, variant, start)
    if arr is None:
        raise DepthlensError(f"no per-sequence interval for {metric!r} with aggregator {aggregator!r}")
    N = int(ds.sizes["sequence"])
    sizes = iv.nested_sizes(N)
    extras: dict[str, Any] = {"subsample_m": None, "eval_sizes": sizes}
    if arr["kind"] == "max":
        exceed = np.nan_to_num(arr["values"], nan=-np.inf) > threshold
        interval, reps, m = iv.max_share_interval(exceed, subsample, level=level)
        extras["subsample_m"] = m
        curve = iv.prefix_max_shares(exceed, sizes)
        jack = True
    else:
        th = threshold**2 if arr["square"] else threshold
        counts = iv.bootstrap_counts(N, n_boot, seed) if n_boot > 0 else None
        interval, reps = iv.ratio_share_interval(arr["num"], arr["den"], th, n_boot=n_boot, level=level, counts=counts)
        curve = np.asarray(iv.ratio_share(arr["num"], arr["den"], th, iv.prefix_counts(N, sizes)))
        jack = False
    extras["share_full"] = float(curve[-1])
    extras["eval_size_shares"] = [float(x) for x in curve]
    extras["still_rising"] = iv.still_rising(sizes, curve)
    return interval, reps, jack, extras


def paired_share_difference(
    a: xr.Dataset,
    b: xr.Dataset,
    metric: str,
    threshold: float | None = None,
    *,
    start: str | int = "quarter",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval | None:
    """share(a) − share(b) (`share_interval`'s estimates) with its interval paired over the eval sequences the
    two share: the same sequence left out (jackknife) or the same resamples (bootstrap). When one ran on a
    prefix of the other's sequences, both use that prefix. None when either has no per-sequence interval."""
    from depthlens.stats.intervals import paired_difference

    threshold = registry.score(metric).theta if threshold is None else float(threshold)
    n = min(a.sizes.get("sequence", 0), b.sizes.get("sequence", 0))
    if n < 2:
        return None
    a, b = (x.isel(sequence=slice(0, n)) if x.sizes["sequence"] > n else x for x in (a, b))
    try:
        pa, pb = (
            share_interval(x, metric, threshold, start=start, n_boot=n_boot, seed=seed, level=level) for x in (a, b)
        )
    except DepthlensError:
        return None
    if pa[1].size == 0 or pb[1].size == 0 or pa[2] != pb[2]:
        return None
    return paired_difference(
        pa[0].estimate,
        pb[0].estimate,
        pa[1],
        pb[1],
        jackknife=pa[2],
        level=level,
        method=pa[0].method.split("; ")[-1],
        n_units=n,
    )


def interval_attrs(h: dict[str, Any]) -> dict[str, Any]:
    """What a headline's interval is, for the attrs of the dataset it was computed from."""
    return {
        "headline_interval_method": str(h.get("ci_method") or "none"),
        "headline_interval_unit": str(h.get("ci_unit") or "none"),
        "headline_interval_level": float(h.get("level", 0.95)),
        "headline_subsample_m": -1 if h.get("subsample_m") is None else int(h["subsample_m"]),
    }


def headline(
    ds: xr.Dataset,
    metric: str = registry.HEADLINES[0],  # the registry's first headline score
    threshold: float | None = None,
    *,
    aggregator: str = "max",
    variant: str = "current",
    start: str | int = "quarter",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """The headline number: share of late pairs above θ with an interval that qualifies it.

    `share` is the estimate the interval is for: with the max aggregator the size-fixed share at m = ⌈N/2⌉
    sequences (an extreme-value statistic has no valid bootstrap at all N), otherwise the share at all N
    sequences. `share_full` is always the ordinary share at all N sequences (for max, the Csordás-exact
    number; no interval). `ci_method` / `ci_unit` name how the interval was made and what was resampled.
    """
    score = registry.score(metric)
    threshold = score.theta if threshold is None else float(threshold)
    selects = bool(score.select)  # read with an aggregator and a variant (C, C_dir)
    m = score_matrix(ds, metric, aggregator if selects else None, variant if selects else None)
    if m.ndim != 2:
        raise DepthlensError(f"headline needs one matrix; select a checkpoint first (dims {m.dims})")
    L = m.shape[0]
    a = late_window(L, start)
    share_full = float(share_curve(m.values, [threshold], a, nan_policy="omit")[0])
    share, lo, hi, method, unit, n_units, note = share_full, float("nan"), float("nan"), None, None, None, None
    extras: dict[str, Any] = {"subsample_m": None, "eval_sizes": None, "eval_size_shares": None, "still_rising": None}
    try:
        interval, _, _, ex = share_interval(
            ds,
            metric,
            threshold,
            aggregator=aggregator,
            variant=variant,
            start=a,
            n_boot=n_boot,
            seed=seed,
            level=level,
        )
    except DepthlensError:
        note = "no interval for this metric/aggregator (not decomposable per sequence)"
    else:
        extras.update({k: v for k, v in ex.items() if k != "share_full"})
        share, method, unit, n_units = interval.estimate, interval.method, interval.unit, interval.n_units
        if n_boot <= 0:  # no interval asked for (the jackknife needs no resamples, but 0 means none)
            method = unit = None
        elif np.isfinite(interval.low):
            lo, hi = interval.low, interval.high
        if ex["subsample_m"] is not None:
            note = (
                f"max is an extreme-value statistic: the share with its interval is the size-fixed share at "
                f"m = {ex['subsample_m']} of {n_units} sequences; at all {n_units}: {share_full:.3f} (no interval)"
            )
    can_shard = n_boot > 0 and method is not None  # decomposable per sequence: shards recompute the same way
    shards = None
    if can_shard and ds.sizes["sequence"] >= 5:  # docs/concepts.md#thresholds: k = 5 disjoint eval shards, mean ± sd
        shards = shard_shares(ds, metric, threshold, 5, aggregator=aggregator, variant=variant, start=a)
    pairs = late_pairs(L, a)
    n_valid = int((~np.isnan(m.values[pairs[:, 0], pairs[:, 1]])).sum())
    T = int(ds.attrs.get("eval_seq_len", 0) or 0)
    out = {
        "metric": metric,
        "threshold": threshold,
        "share": share,
        "ci_low": lo,
        "ci_high": hi,
        "ci_method": method,
        "ci_unit": unit,
        "ci_n_units": n_units,
        "share_full": share_full,
        **extras,
        "eval_size_tokens": [n * T for n in extras["eval_sizes"]] if extras["eval_sizes"] and T else None,
        "n_pairs": n_valid,
        "window_start": a,
        "window_rule": start,
        "aggregator": aggregator if selects else None,
        "variant": variant if selects else None,
        "n_boot": n_boot,
        "seed": seed,
        "level": level,
        "n_sequences": int(ds.sizes.get("sequence", 0)),
        "comparison": "strict >",
        "note": note,
        "shard_mean": shards.attrs["mean"] if shards is not None else None,
        "shard_sd": shards.attrs["sd"] if shards is not None else None,
    }
    fields = (
        {"norm": metric}
        if score.headline_fields is None
        else registry.resolve(score.headline_fields)(ds, metric, variant)
    )
    out["norm"] = fields.pop("norm")
    out["definition"] = definition(
        metric,
        variant=variant if selects else None,
        aggregator=aggregator if selects else None,
        norm=out["norm"],
        swap=ds.attrs.get("swap"),
    )
    out.update(fields)  # e.g. C's noise floor, P's clean loss
    return out

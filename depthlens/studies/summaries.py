"""How each diagnostic's Dataset is summarised: its report row fields, its `track` variables and its headline
share, named by the registry (`Diagnostic.record`, `Diagnostic.track`) so report and track loop over the
registry instead of switching on names.

    row.update(record_fields(d, ds, row))         # the report row: the share columns, then the diagnostic's own
    vars = track_vars(d, ds, opts)                # one snapshot's variables in `depthlens track`

A diagnostic with a headline score and no hooks gets the generic summaries: the share of late pairs above θ
with its bootstrap CI and shard mean/sd (report and track), and its score matrix (track).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.io.jsonsafe import finite_or_none as _f

UNTRAINED_RECORD_FIELDS = registry.UNTRAINED_RECORD_FIELDS  # read off the untrained model's datasets too

SHARE_FIELDS = ("share", "ci_low", "ci_high", "shard_mean", "shard_sd")  # of a headline, under `<prefix>_*`
# what the interval is (method, unit of resampling, subsample size for max) and the eval-size curve
INTERVAL_FIELDS = (
    "ci_method",
    "ci_unit",
    "share_full",
    "subsample_m",
    "eval_sizes",
    "eval_size_tokens",
    "eval_size_shares",
    "still_rising",
)
# the same headline on the untrained model, and trained − untrained with its paired interval (report.build)
UNTRAINED_FIELDS = ("share_untrained", "untrained_n_seq", "untrained_diff", "untrained_diff_low", "untrained_diff_high")


class SummaryOptions(Protocol):
    """What the summaries read from a report's or track's options."""

    n_boot: int
    seed: int


def headline_of(
    ds: xr.Dataset, key: str, *, theta: float | None = None, n_boot: int = 1000, seed: int = 0, start: str = "quarter"
) -> dict[str, Any] | None:
    """`sweep.headline` of score `key`, None where the depth has no late pairs (fewer than 2 late layers)."""
    from depthlens.diagnostics.sweep import headline

    try:
        return headline(ds, key, theta, n_boot=n_boot, seed=seed, start=start)
    except (DepthlensError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------------------------
# the report row


def record_keys(
    base: tuple[str, ...], end: tuple[str, ...], diagnostics: tuple[registry.Diagnostic, ...] | None = None
) -> tuple[str, ...]:
    """Every field of a report row, in summary.json order: `base`, each diagnostic's (its share columns, its
    own fields, its definition and crossings), then `end`. diagnostics None: the registry's current ones."""
    keys = list(base)
    for d in registry.diagnostics() if diagnostics is None else diagnostics:
        if d.headline:
            keys += [f"{d.prefix}_{k}" for k in (*SHARE_FIELDS, *INTERVAL_FIELDS, "n_pairs", *UNTRAINED_FIELDS)]
        keys += d.record_fields
        if d.headline:
            keys += [f"{d.prefix}_definition", f"{d.prefix}_theta_50", f"{d.prefix}_theta_10"]
    return tuple(keys + list(end))


def share_fields(d: registry.Diagnostic, h: Mapping[str, Any]) -> dict[str, Any]:
    """share, CI, shard mean/sd, pair count and definition of one headline, under `<prefix>_*` record keys
    (plus `<prefix>_noise_floor` where the diagnostic declares that field)."""
    out = {f"{d.prefix}_{k}": _f(h.get(k)) for k in SHARE_FIELDS}
    out.update({f"{d.prefix}_{k}": _f(h[k]) if isinstance(h.get(k), float) else h.get(k) for k in INTERVAL_FIELDS})
    out[f"{d.prefix}_n_pairs"] = h["n_pairs"]
    out[f"{d.prefix}_definition"] = h.get("definition")
    if f"{d.prefix}_noise_floor" in d.record_fields:
        out[f"{d.prefix}_noise_floor"] = _f(h.get("noise_floor"))
    return out


def record_fields(
    d: registry.Diagnostic, ds: xr.Dataset, row: Mapping[str, Any], opts: SummaryOptions
) -> dict[str, Any]:
    """Diagnostic `d`'s fields of one report row: its headline share (if any), then its own `record` hook's."""
    out: dict[str, Any] = {}
    if d.headline:
        h = headline_of(ds, d.headline.key, n_boot=opts.n_boot, seed=opts.seed)
        if h:
            from depthlens.diagnostics.sweep import interval_attrs

            out.update(share_fields(d, h))
            ds.attrs.update(interval_attrs(h))  # the merged netCDF names the interval its record carries
    if d.record:
        out.update(registry.resolve(d.record)(ds, {**row, **out}))
    return out


def causal_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The eval loss, from the clean forward of the causal engine."""
    if "clean_loss_seq" not in ds:
        return {}
    v = ds["clean_loss_seq"].values
    return {"eval_loss": _f(np.nanmean(v)) if np.isfinite(v).any() else None}


def permutation_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The eval loss from the permutation engine's identity order, where the causal one did not give it."""
    if row.get("eval_loss") is None and "clean_loss" in ds:
        return {"eval_loss": _f(ds["clean_loss"].values)}
    return {}


def rank_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    out = {
        "erank_full": _f(ds["erank"].sel(product="full", statistic="mean").values),
        "erank_late": _f(ds["erank"].sel(product="late", statistic="mean").values),
    }
    if "n_streams" in ds.coords:
        out["n_streams"] = int(ds["n_streams"].values)
    return out


def _dead_prefix_at(ds: xr.Dataset, eps_wanted: float, tol: float) -> float | None:
    """k*(ε) at ε = eps_wanted when the engine's ε grid holds it, else None."""
    eps = np.asarray(ds["eps"].values, dtype=float)
    k = int(np.argmin(np.abs(eps - eps_wanted)))
    return float(ds["dead_prefix"].values[k]) if abs(eps[k] - eps_wanted) < tol else None


def attnres_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    if "dead_prefix" not in ds:
        return {}
    k = _dead_prefix_at(ds, registry.DEAD_PREFIX_EPS, 1e-9)
    return {} if k is None else {"dead_prefix": int(k)}


def angular_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    if "profile" not in ds:
        return {}
    prof = np.asarray(ds["profile"].values, dtype=float)[: int(row["n_layer"])]
    return {"angular_d1_mean": _f(np.nanmean(prof)) if np.isfinite(prof).any() else None}


# ---------------------------------------------------------------------------------------------------------------
# track


class TrackSummaryOptions(SummaryOptions, Protocol):
    window: str
    causal_threshold: float
    perm_threshold: float
    eps: float


def track_theta(opts: TrackSummaryOptions, key: str) -> float:
    """The headline θ `track` uses for score `key` (its own options for C and P_abs, else the registry's)."""
    return {"causal": opts.causal_threshold, "perm_abs": opts.perm_threshold}.get(key, registry.score(key).theta)


def _track_headline(ds: xr.Dataset, key: str, opts: TrackSummaryOptions) -> dict[str, Any]:
    return (
        headline_of(ds, key, theta=track_theta(opts, key), n_boot=opts.n_boot, seed=opts.seed, start=opts.window) or {}
    )


def _scalar(v: Any, name: str, units: str = "1") -> xr.DataArray:
    return xr.DataArray(np.float64(np.nan if v is None else v), attrs={"long_name": name, "units": units})


def _keep(da: xr.DataArray, long_name: str, units: str = "1") -> xr.DataArray:
    da = da.drop_vars([c for c in da.coords if c not in da.dims])
    return da.assign_attrs(long_name=long_name, units=units)


def share_vars(prefix: str, h: Mapping[str, Any], label: str) -> dict[str, xr.DataArray]:
    """The share, its bootstrap CI and its shard mean/sd as scalar variables `<prefix>_*`."""
    return {
        f"{prefix}_share": _scalar(h.get("share"), f"share of late pairs with {label}"),
        f"{prefix}_ci_low": _scalar(h.get("ci_low"), f"{label}: bootstrap CI low (95%, over sequences)"),
        f"{prefix}_ci_high": _scalar(h.get("ci_high"), f"{label}: bootstrap CI high (95%, over sequences)"),
        f"{prefix}_shard_mean": _scalar(h.get("shard_mean"), f"{label}: mean share over 5 disjoint eval shards"),
        f"{prefix}_shard_sd": _scalar(h.get("shard_sd"), f"{label}: sd of the share over 5 eval shards"),
    }


def track_vars(d: registry.Diagnostic, ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    """The per-step variables `track` keeps from one engine result of `d` (no `step` dim yet)."""
    if d.track:
        tracked: dict[str, xr.DataArray] = registry.resolve(d.track)(ds, opts)
        return tracked
    if d.headline is None:
        raise DepthlensError(f"{d.name} is not tracked over training (no headline score and no track hook)")
    return headline_track(d, ds, opts)


def headline_track(d: registry.Diagnostic, ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    """The generic track variables: the headline share with its CI, and the headline score matrix."""
    from depthlens.diagnostics.sweep import score_matrix

    s = d.headline
    assert s is not None
    theta = track_theta(opts, s.key)
    out = share_vars(d.prefix, _track_headline(ds, s.key, opts), f"{s.symbol} > {theta:g} {s.unit}")
    out[s.var] = _keep(score_matrix(ds, s.key, s.select.get("aggregator"), s.select.get("variant")), s.label, s.unit)
    return out


def causal_track(ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    from depthlens.diagnostics.sweep import score_matrix

    h = _track_headline(ds, "causal", opts)
    out = share_vars("causal", h, f"causal score > {opts.causal_threshold}")
    out["causal_score"] = _keep(
        score_matrix(ds, "causal", "max", "current"), "causal score C(s, t), current variant, max over tokens"
    )
    out["causal_noise_floor"] = _scalar(h.get("noise_floor"), "causal score of a null intervention")
    out["eval_loss"] = _scalar(float(ds["clean_loss_seq"].mean()), "clean next-token loss on the eval tokens", "nat")
    return out


def permutation_track(ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    out = share_vars("perm", _track_headline(ds, "perm_abs", opts), f"P_abs > {opts.perm_threshold} nat")
    out["perm_abs"] = _keep(ds["perm_abs"], "loss increase when layers i and j swap (P_abs)", "nat")
    return out


def rank_track(ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    return {
        "erank": _keep(ds["erank"].sel(statistic="mean"), "effective rank of the residual-mixing product (token mean)")
    }


def attnres_track(ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    dead = _dead_prefix_at(ds, opts.eps, 1e-12)
    return {
        "self_weight": _keep(ds["self_weight"], "AttnRes self-weight per layer (token mean)"),
        "dead_prefix": _scalar(
            np.nan if dead is None else dead,
            f"dead prefix k*({opts.eps:g}): leading layers with self-weight below {opts.eps:g}",
        ),
    }


def angular_track(ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    prof = _keep(ds["profile"], "angular distance between consecutive residual states d(h_l, h_l+1)")
    return {"angular_profile": prof.rename(layer="state")}

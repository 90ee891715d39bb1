"""How each diagnostic's Dataset is summarised: its report row fields, its `track` variables and its headline
share. The generic part (a headline share with its CI and shard mean/sd, and the score matrix) lives here; a
diagnostic's own fields come from its registry hooks (`Hooks.record`, `Hooks.track`), which sit beside
its engine in the diagnostics layer, so report and track loop over the registry instead of switching on names.

    row.update(record_fields(d, ds, row))         # the report row: the share columns, then the diagnostic's own
    vars = track_vars(d, ds, opts)                # one snapshot's variables in `depthlens track`
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.io.dataset import kept_var, scalar_var
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
    record = d.loaded().record
    if record:
        out.update(record(ds, {**row, **out}))
    return out


# ---------------------------------------------------------------------------------------------------------------
# track


class TrackSummaryOptions(SummaryOptions, Protocol):
    window: str
    causal_threshold: float
    perm_threshold: float
    eps: float


def track_theta(opts: TrackSummaryOptions, key: str) -> float:
    """The headline θ `track` uses for score `key`: its `<prefix>_threshold` option for a diagnostic's headline
    score (C, P_abs), else the registry's."""
    owner, score = registry.score_owner(key)
    own = getattr(opts, f"{owner.prefix}_threshold", None) if score is owner.headline else None
    theta: float = score.theta if own is None else own
    return theta


def _track_headline(ds: xr.Dataset, key: str, opts: TrackSummaryOptions) -> dict[str, Any]:
    return (
        headline_of(ds, key, theta=track_theta(opts, key), n_boot=opts.n_boot, seed=opts.seed, start=opts.window) or {}
    )


def share_vars(prefix: str, h: Mapping[str, Any], label: str) -> dict[str, xr.DataArray]:
    """The share, its bootstrap CI and its shard mean/sd as scalar variables `<prefix>_*`."""
    return {
        f"{prefix}_share": scalar_var(h.get("share"), f"share of late pairs with {label}"),
        f"{prefix}_ci_low": scalar_var(h.get("ci_low"), f"{label}: bootstrap CI low (95%, over sequences)"),
        f"{prefix}_ci_high": scalar_var(h.get("ci_high"), f"{label}: bootstrap CI high (95%, over sequences)"),
        f"{prefix}_shard_mean": scalar_var(h.get("shard_mean"), f"{label}: mean share over 5 disjoint eval shards"),
        f"{prefix}_shard_sd": scalar_var(h.get("shard_sd"), f"{label}: sd of the share over 5 eval shards"),
    }


def track_vars(d: registry.Diagnostic, ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    """The per-step variables `track` keeps from one engine result of `d` (no `step` dim yet): the generic
    headline share and score matrix (if `d` has a headline), updated with its own `track` hook's variables."""
    if not d.tracked:
        raise DepthlensError(f"{d.name} is not tracked over training (no headline score and no track hook)")
    out = headline_track(d, ds, opts) if d.headline else {}
    track = d.loaded().track
    if track:
        out.update(track(ds, opts))
    return out


def headline_track(d: registry.Diagnostic, ds: xr.Dataset, opts: TrackSummaryOptions) -> dict[str, xr.DataArray]:
    """The generic track variables: the headline share with its CI, and the headline score matrix."""
    from depthlens.diagnostics.sweep import score_matrix

    s = d.headline
    assert s is not None
    theta = track_theta(opts, s.key)
    unit = "" if s.unit == "1" else f" {s.unit}"
    out = share_vars(d.prefix, _track_headline(ds, s.key, opts), f"{s.symbol} > {theta:g}{unit}")
    out[s.var] = kept_var(score_matrix(ds, s.key, s.select.get("aggregator"), s.select.get("variant")), s.label, s.unit)
    return out

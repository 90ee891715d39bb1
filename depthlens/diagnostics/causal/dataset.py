"""What the causal engine (`causal.causal_scores`) accumulates over batches, `_Results`, and the xarray Dataset
built from it at the end, `_dataset`: the causal and direct score matrices under every aggregator in
`AGGREGATORS`, their per-sequence sums (for the bootstrap), the noise floor, and the companions (output effect,
layer-skip loss, clean loss), with the options and cut positions the run used in its attrs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from depthlens.diagnostics.causal.arms import _CellStore, _nanmax
from depthlens.errors import DepthlensError
from depthlens.io.dataset import data_var, kept_var, scalar_var
from depthlens.io.jsonsafe import finite_or_none
from depthlens.runtime.evaldata import EvalData, model_dataset
from depthlens.stats.metrics import late_window
from depthlens.stats.shares import PerSequence

if TYPE_CHECKING:  # typing only: the protocol module is not needed to build a Dataset
    from depthlens.models.protocol import LayeredLM

AGGREGATORS = ("max", "mean", "p95", "p99", "pooled")


UNDEFINED_NOTE = (
    "NaN where t < s (blocks before s never see the skip: no measurement); rows of layers not skipped are NaN; "
    "with unit=block, C(s, s) = 1 by construction (skipping s removes u_s whole)"
)


def _undefined(L: int) -> np.ndarray:
    """(L, L) bool: the cells of C(s, t) that are no measurement, t < s (the blocks before s never see the skip)."""
    return np.tril(np.ones((L, L), bool), -1)


@dataclass
class _Results:
    """Everything accumulated over batches."""

    store: dict[str, _CellStore]  # variant -> ratios of C(s, t)
    null_store: dict[str, _CellStore]  # variant -> ratios of the skip-nothing arm
    dstore: dict[str, _CellStore]  # variant -> ratios of C_dir(s, t)
    O: dict[str, np.ndarray]  # variant -> (L, N) per-sequence output effect
    dloss: np.ndarray  # (L, N) per-sequence ΔL_skip
    clean_loss: np.ndarray  # (N,)


def _dataset(
    model: LayeredLM,
    data: EvalData,
    checkpoint: Any,
    S: list[int],
    variants: Sequence[str],
    cuts: dict[str, np.ndarray],
    res: _Results,
    options: dict[str, Any],
) -> xr.Dataset:
    L, N = model.n_layer, data.n_seq
    store, null_store, dstore, O, dloss, clean_loss = (
        res.store,
        res.null_store,
        res.dstore,
        res.O,
        res.dloss,
        res.clean_loss,
    )
    LL = ("layer", "layer_other")
    dv: dict[str, Any] = {}
    if store:
        agg = {v: store[v].aggregate() for v in variants}
        undefined = _undefined(L)
        C = np.stack([np.stack([store[v].to_matrix(agg[v][a], S, L) for a in AGGREGATORS]) for v in variants])
        C[..., undefined] = np.nan
        dv["causal_score"] = data_var(
            ("variant", "aggregator", *LL),
            C,
            "causal score C(s,t): relative change of update u_t when layer s is skipped",
            description=UNDEFINED_NOTE,
        )
        later = np.triu(np.ones((L, L), bool), 1)  # t > s
        with np.errstate(invalid="ignore"):
            mean_down = np.where(later, C, 0).sum(-1) / np.maximum(later.sum(-1), 1)
        mean_down[..., L - 1] = np.nan  # the last layer has no later layer
        mean_down[..., [l for l in range(L) if l not in S]] = np.nan
        dv["mean_downstream_effect"] = data_var(
            ("variant", "aggregator", "layer"),
            mean_down,
            "mean causal score on later layers, mean_{t>s} C(s,t) (Csordas skip_max_depth)",
        )
        per = {v: store[v].per_sequence() for v in variants}
        names = {
            "max": ("seq_max", "per-sequence max of the token ratios"),
            "sum": ("seq_sum", "per-sequence sum of the token ratios"),
            "count": ("seq_count", "per-sequence number of measured tokens"),
            "num": ("seq_sq_change", "per-sequence sum of squared update changes"),
            "den": (
                "seq_sq_update",
                "per-sequence sum of squared denominators (clean |u_t|, or |h_t| under norm=resid)",
            ),
        }
        for key, (name, long) in names.items():
            arr = np.stack([store[v].to_matrix(per[v][key], S, L, lower=np.nan) for v in variants])
            arr[:, undefined] = np.nan
            dv[name] = data_var(("variant", *LL, "sequence"), arr, long)
    if null_store:
        dv["null_score"] = data_var(
            ("variant",),
            np.array([np.nanmax(null_store[v].aggregate()["max"]) for v in variants]),
            "noise floor: max causal score of a skip-nothing intervention",
        )
    if dstore:
        agg = {v: dstore[v].aggregate() for v in variants}
        Cd = np.stack([np.stack([dstore[v].to_matrix(agg[v][a], S, L) for a in AGGREGATORS]) for v in variants])
        for i in range(L):
            if i in S:
                Cd[..., i, i] = 0.0  # the direct effect has a zero diagonal (docs/concepts.md#causal-score)
        Cd[..., _undefined(L)] = np.nan
        dv["direct_score"] = data_var(
            ("variant", "aggregator", *LL),
            Cd,
            "direct causal score C_dir(s,t): layer t fed its clean input minus u_s",
            description="NaN where t < s (no measurement: blocks before s never see the skip); t = s is 0 by "
            "construction",
        )
    if options["outputs"]:
        Os = np.stack([O[v] for v in variants])
        dv["output_effect_seq"] = data_var(
            ("variant", "layer", "sequence"), Os, "per-sequence max L2 change of the next-token distribution"
        )
        dv["output_effect"] = data_var(
            ("variant", "layer"),
            _nanmax(Os, axis=2),
            "output effect O[s]: max L2 change of the next-token distribution",
        )
        if "current" in variants:
            dv["skip_delta_loss_seq"] = data_var(
                ("layer", "sequence"), dloss, "per-sequence loss increase when the layer is skipped", "nat"
            )
            with np.errstate(invalid="ignore"):
                mean = np.where(
                    np.isnan(dloss).all(1), np.nan, np.nansum(dloss, 1) / np.maximum((~np.isnan(dloss)).sum(1), 1)
                )
            dv["skip_delta_loss"] = data_var(("layer",), mean, "loss increase when the layer is skipped", "nat")
    dv["clean_loss_seq"] = data_var(("sequence",), clean_loss, "per-sequence clean next-token loss", "nat")
    coords = {
        "layer": np.arange(L),
        "layer_other": np.arange(L),
        "variant": list(variants),
        "aggregator": list(AGGREGATORS),
        "sequence": np.arange(N),
    }
    opts = {
        **options,
        "cut_positions": {v: cuts[v].tolist() for v in variants if v == "future"},
        "cut_sampling": "Csordas test_future_max_effect: one random.Random(cut_seed) per run; each sequence "
        "(eval order) reshuffles range(8, T-4, 8) and takes the first n_cuts",
        "intervened_positions": {"current": "[1, T)", "future": "[1, c)"},
        "measured_positions": {"current": "[1, T)", "future": "[c, T)"},
        "loss_positions": "tau in [1, T-2] predicting token tau+1",
        "late_window_start": late_window(L),
        "aggregation": "max/mean/p95/p99 over pooled (sequence, cut, token); pooled = sqrt(sum|du|^2/sum|u|^2)",
    }
    title = "depthlens causal score (skip layer s, change of update u_t)"
    axis_names = {"layer": "skipped layer s", "layer_other": "measured layer t"}
    return model_dataset(
        model, data, checkpoint, dv, coords, metric="causal", title=title, options=opts, coord_names=axis_names
    )


def skip_summary(ds: xr.Dataset) -> dict[str, Any] | None:
    """With the skip companions (`outputs=True`): the layer whose skip costs most in loss (ΔL_skip, nats) and in
    output distribution (O, current variant), and the mean ΔL_skip; None without them."""
    if "skip_delta_loss" not in ds:
        return None
    dl, o = ds["skip_delta_loss"].values, ds["output_effect"].sel(variant="current").values
    s, so = int(np.nanargmax(dl)), int(np.nanargmax(o))
    return {
        "max_skip_loss": float(dl[s]),
        "max_skip_loss_layer": s,
        "mean_skip_loss": float(np.nanmean(dl)),
        "max_output_effect": float(o[so]),
        "max_output_effect_layer": so,
    }


# ---------------------------------------------------------------------------------------------------------------
# its report row and `track` variables (registry hooks; the headline share itself is the generic summary's)


def causal_record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The eval loss, from the clean forward of the causal engine."""
    if "clean_loss_seq" not in ds:
        return {}
    v = ds["clean_loss_seq"].values
    return {"eval_loss": finite_or_none(np.nanmean(v)) if np.isfinite(v).any() else None}


def causal_track(ds: xr.Dataset, opts: Any) -> dict[str, xr.DataArray]:
    """Besides the headline share: C(s, t) (current, max) under its full name, the noise floor and the clean loss."""
    score, null = ds["causal_score"], ds.get("null_score")
    sel = {k: v for k, v in (("aggregator", "max"), ("variant", "current")) if k in score.dims}
    out = {"causal_score": kept_var(score.sel(sel), "causal score C(s, t), current variant, max over tokens")}
    floor = None
    if null is not None:
        floor = float(null.sel(variant="current").values if "variant" in null.dims else null.values)
    out["causal_noise_floor"] = scalar_var(floor, "causal score of a null intervention")
    out["eval_loss"] = scalar_var(float(ds["clean_loss_seq"].mean()), "clean next-token loss on the eval tokens", "nat")
    return out


HEADLINE_NAMES = {"causal": "causal C(s,t)", "direct": "direct C_dir(s,t)"}  # how a definition line names them


def describe_headline(
    score: Any, *, variant: str | None, aggregator: str | None, norm: str | None, swap: str | None
) -> str:
    """`Score.describe` of C and C_dir: 'causal C(s,t): variant=current, aggregator=max, norm=update'."""
    return f"{HEADLINE_NAMES[score.key]}: variant={variant}, aggregator={aggregator}, norm={norm or 'update'}"


def headline_fields(ds: xr.Dataset, metric: str, variant: str) -> dict[str, Any]:
    """`Score.headline_fields` of C and C_dir: the norm the ratios were taken in, and the noise floor (the score
    of a no-op intervention) when the Dataset has one."""
    out: dict[str, Any] = {"norm": str(ds.attrs.get("norm", "update"))}
    if "null_score" in ds:
        null = ds["null_score"]
        out["noise_floor"] = float(null.sel(variant=variant).values if "variant" in null.dims else null.values)
    return out


def causal_per_sequence(ds: xr.Dataset, aggregator: str, variant: str) -> PerSequence | None:
    """C(s, t) of `aggregator` as per-sequence parts (`Score.per_sequence`): max → the per-sequence max over
    tokens; mean → Σ|Δ|/|u| sums over token counts; pooled → sqrt(Σ|Δ|² / Σ|u|²). p95/p99: None (not decomposable
    per sequence)."""
    if "seq_max" not in ds:
        raise DepthlensError("bootstrap needs the per-sequence variables of causal_scores (seq_max, ...)")
    sel = {"variant": variant} if "variant" in ds["seq_max"].dims else {}

    def part(name: str) -> np.ndarray:
        return np.asarray(ds[name].sel(sel).values)

    if aggregator == "max":
        return PerSequence("max", values=part("seq_max"))
    if aggregator == "mean":
        return PerSequence("ratio", num=part("seq_sum"), den=part("seq_count"), fill=True)
    if aggregator == "pooled":
        return PerSequence("ratio", num=part("seq_sq_change"), den=part("seq_sq_update"), square=True, fill=True)
    return None


def regrow(ds: xr.Dataset, parts: Sequence[xr.Dataset]) -> list[str]:
    """`Hooks.regrow` of the causal score (--precision): in `ds`, concatenated over the sequences of `parts`,
    the cut positions of every part, and `causal_score` for the max, mean and pooled aggregators re-derived from the
    per-sequence variables (max of maxima, ratio of summed sums / counts and of squared sums: what one run over all
    the sequences computes) with `mean_downstream_effect`. Returns the aggregators it cannot rebuild (p95, p99:
    they need every token's ratio, which a part does not keep), now NaN."""
    cuts: dict[str, list[Any]] = {}
    for p in parts:
        for v, rows in json.loads(p.attrs.get("cut_positions_json", "{}")).items():
            cuts.setdefault(v, []).extend(rows)
    ds.attrs["cut_positions_json"] = json.dumps(cuts)
    cs = ds["causal_score"]
    new = cs.values.copy()
    aggs = list(cs["aggregator"].values)
    with np.errstate(invalid="ignore", divide="ignore"):
        derived: dict[str, Any] = {  # DataArrays (np.sqrt of one is one)
            "max": ds["seq_max"].max("sequence", skipna=True),
            "mean": ds["seq_sum"].sum("sequence") / ds["seq_count"].sum("sequence"),
            "pooled": np.sqrt(ds["seq_sq_change"].sum("sequence") / ds["seq_sq_update"].sum("sequence")),
        }
    dropped = []
    for i, a in enumerate(aggs):
        if a in derived:
            val = derived[a].transpose("variant", "layer", "layer_other").values
            new[:, i] = np.where(np.isnan(cs.values[:, i]), np.nan, val)  # pairs never measured stay NaN
        else:
            new[:, i] = np.nan
            dropped.append(str(a))
    ds["causal_score"] = (cs.dims, new, cs.attrs)
    if "mean_downstream_effect" in ds:
        md = ds["mean_downstream_effect"]
        L = new.shape[-1]
        later = np.triu(np.ones((L, L), bool), 1)
        with np.errstate(invalid="ignore"):
            mean_down = np.where(later, new, 0).sum(-1) / np.maximum(later.sum(-1), 1)
        mean_down = np.where(np.isnan(md.values), np.nan, mean_down)
        ds["mean_downstream_effect"] = (md.dims, mean_down, md.attrs)
    return dropped

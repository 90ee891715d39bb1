"""The lens family's report row and terminal view (registry hooks of `logit_lens` and `tuned_lens`).

    row.update(record_of("logit")(ds, row))   # where the prediction forms, KL and top-1 agreement at mid-depth
    head, lines, table = lens_view(ds, model)

The report row names its fields after the diagnostic (`logit_lens_forms`, `tuned_lens_forms`, ...); the untrained
twin's `*_forms` rides along as `*_forms_untrained` (registry.UNTRAINED_RECORD_FIELDS).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from depthlens.io.jsonsafe import finite_or_none as _f

FIELDS = ("forms", "forms_low", "forms_high", "kl_mid", "agree_mid", "forms_at")


def _kind(ds: xr.Dataset) -> str:
    return str(ds.attrs.get("kind", "")) or str(ds.attrs.get("metric", "logit_lens")).split("_")[0]


def at_depth(da: xr.DataArray, depth: float) -> float:
    """The value at the first layer boundary whose relative depth is >= `depth`."""
    d = np.asarray(da["depth"].values, dtype=float)
    return float(da.values[int(np.argmax(d >= depth - 1e-12))])


def lens_fields(ds: xr.Dataset) -> dict[str, Any]:
    """Where the prediction forms (with its interval) and the mid-depth KL and top-1 agreement."""
    if "forms_depth" not in ds:
        return {}
    return {
        "forms": _f(float(ds["forms_depth"])),
        "forms_low": _f(float(ds["forms_depth_low"])),
        "forms_high": _f(float(ds["forms_depth_high"])),
        "kl_mid": _f(at_depth(ds["lens_kl"], 0.5)),
        "agree_mid": _f(at_depth(ds["top1_agree"], 0.5)),
        "forms_at": _f(float(ds["forms_depth"].attrs.get("forms_at", np.nan))),
    }


def record_of(kind: str) -> Callable[[xr.Dataset, Mapping[str, Any]], dict[str, Any]]:
    """The report-row hook of the `kind` lens: its fields named `<kind>_lens_<field>`."""

    def record(ds: xr.Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
        return {f"{kind}_lens_{k}": v for k, v in lens_fields(ds).items()}

    return record


def _iv(ds: xr.Dataset, var: str, l: int, fmt: str) -> str:
    v = float(ds[var].values[l])
    lo, hi = (float(x) for x in ds[f"{var}_ci"].values[l])
    return f"{v:{fmt}}" + (f" [{lo:{fmt}}, {hi:{fmt}}]" if np.isfinite(lo) else "")


def forms_line(ds: xr.Dataset, kind: str) -> str:
    """'tuned lens: the prediction forms at depth 0.40 [0.33, 0.47] (first l/L with top-1 agreement > 0.5; ...)'."""
    f = ds["forms_depth"]
    est, lo, hi = float(f), float(ds["forms_depth_low"]), float(ds["forms_depth_high"])
    at = f.attrs.get("forms_at", 0.5)
    if not np.isfinite(est):
        return f"{kind} lens: top-1 agreement with the final layer never exceeds {at:g} before the last layer"
    ci = f" [{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) else ""
    return f"{kind} lens: prediction forms at l/L = {est:.2f}{ci} (top-1 agreement > {at:g}; bootstrap over sequences)"


def lens_view(ds: xr.Dataset, model: Any) -> tuple[dict[str, Any], list[str], Any]:
    """The terminal view: the headline line, then one row per layer boundary (KL, top-1, rank, CE with
    intervals)."""
    from rich.table import Table

    kind = _kind(ds)
    head: dict[str, Any] = {
        "metric": f"{kind}_lens",
        "design": getattr(model.design, "slug", "?"),
        "n_layer": int(model.n_layer),
        **lens_fields(ds),
        "by_layer": {v: [_f(x) for x in ds[v].values] for v in ("lens_kl", "top1_agree", "target_rank", "lens_ce")},
    }
    for k in ("cache", "train_cpu_seconds", "eval_cpu_seconds", "train_split"):
        if k in ds.attrs:
            head[k] = ds.attrs[k]
    lines = [forms_line(ds, kind)]
    if kind == "tuned" and "train_split" in ds.attrs:
        split, cache = ds.attrs["train_split"], ds.attrs.get("cache", "-")
        lines.append(f"translators trained on {split} (cache: {cache})")
    t = Table(title=f"{kind} lens by layer boundary: sequence means [95% interval]", box=None)
    for col in ("l", "l/L", "KL to final (nat)", "top-1 agree", "rank", "CE (nat)"):
        t.add_column(col, justify="right")
    for l in range(ds.sizes["layer"]):
        t.add_row(
            str(int(ds["layer"].values[l])),
            f"{float(ds['depth'].values[l]):.2f}",
            _iv(ds, "lens_kl", l, ".3f"),
            _iv(ds, "top1_agree", l, ".2f"),
            f"{float(ds['target_rank'].values[l]):.1f}",
            f"{float(ds['lens_ce'].values[l]):.3f}",
        )
    return head, lines, t

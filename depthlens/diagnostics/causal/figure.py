"""One checkpoint's causal score C(s, t): a heatmap, on a log colour scale where it spans decades.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depthlens.plotting import plots
from depthlens.plotting.panels import LOG_FLOOR, Entry, causal_scale, finite, heading, subplots

from .headline import CAUSAL


def fig_causal(ds: xr.Dataset, e: Entry, share: float | None = None) -> Any:
    """C(s, t) (current variant, max aggregator) for the skipped layers (rows) and measured layers (cols)."""
    da = ds[CAUSAL.var].sel(dict(CAUSAL.select))  # the headline matrix: current variant, max aggregator
    computed = [int(l) for l in da["layer"].values if finite(da.sel(layer=l).values)]
    if computed:
        # rows: the skipped layers that were run; columns from the first of them (earlier t are undefined)
        da = da.sel(layer=computed, layer_other=[int(t) for t in da["layer_other"].values if t >= computed[0]])
    da = plots.upper_triangle(da)  # t < s is undefined (NaN): blank, not the colour of "no effect"
    fig, ax = subplots()
    ax = ax[0, 0]
    top = float(np.nanmax(da.values)) if finite(da) else 1.0
    sc = causal_scale(top)
    plots.heatmap(da, ax, cmap="viridis", annot=max(da.shape) <= 8 and sc["scale"] == "linear", **sc)
    extra = "" if share is None else f" · share > {CAUSAL.theta:g}: {share:.2f}"
    if sc["scale"] == "log":
        extra += f"\n(log colour scale: max C = {top:.3g}; C < {LOG_FLOOR:g} in the lowest colour)"
    ax.set_title(f"{heading(e)}\ncausal score C(s, t), current/max{extra}", fontsize=10)
    return fig

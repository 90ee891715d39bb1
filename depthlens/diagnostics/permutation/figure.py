"""One checkpoint's permutation score P_abs on the late window, on a diverging scale about 0.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import xarray as xr

from depthlens.plotting import plots
from depthlens.plotting.panels import Entry, heading, span, subplots
from depthlens.stats.metrics import late_window

from .headline import PERM_ABS


def fig_permutation(ds: xr.Dataset, e: Entry, share: float | None = None) -> Any:
    """P_abs(i, j) on the late window (diverging scale about 0: a swap can also lower the loss)."""
    a = int(ds.attrs.get("late_window_start", late_window(e.n_layer)))
    da = ds["perm_abs"].isel(layer=slice(a, None), layer_other=slice(a, None))
    lo, hi = span(da.values)
    radius = max(abs(lo), abs(hi), 1e-3)
    fig, ax = subplots()
    ax = ax[0, 0]
    plots.heatmap(da, ax, vmin=-radius, vmax=radius, center=0.0, cmap="vlag", annot=max(da.shape) <= 8)
    extra = "" if share is None else f" · share > {PERM_ABS.theta:g} nat: {share:.2f}"
    ax.set_title(f"{heading(e)}\npermutation P_abs, late window{extra}", fontsize=10)
    return fig

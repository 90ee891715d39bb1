"""One checkpoint's depth-mixing matrix M[i → j], or MoDA's depth-attention mass where it has no mix.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import xarray as xr

from depthlens.plotting import plots
from depthlens.plotting.panels import MIXING_LINTHRESH, Entry, finite, heading, span, subplots


def fig_mixing(ds: xr.Dataset, e: Entry) -> Any | None:
    """M[i → j] (token mean); MoDA: depth-attention mass per sublayer instead. None if neither exists."""
    da = ds["depth_mixing"]
    if finite(da):
        # source i (the output of sublayer i−1) exists only for destinations j ≥ i: the rest is undefined
        da = plots.upper_triangle(da)
        fig, ax = subplots()
        ax = ax[0, 0]
        lo, hi = span(da.values)
        r = max(abs(lo), abs(hi))
        # HC's M reaches thousands next to weights of order 1: a linear scale would show one dark corner
        scale = "symlog" if r > 10 else "linear"
        note = (
            f"symmetric-log colours (linear within ±{MIXING_LINTHRESH:g}), |M| ≤ {r:.3g}" if scale == "symlog" else ""
        )
        if lo < 0:
            plots.heatmap(da, ax, vmin=-r, vmax=r, center=0.0, cmap="vlag", scale=scale, linthresh=MIXING_LINTHRESH)
        else:
            plots.heatmap(da, ax, vmin=0.0, vmax=max(hi, 1e-6), cmap="viridis", scale=scale, linthresh=MIXING_LINTHRESH)
        ax.set_title(f"{heading(e)}\ndepth-mixing matrix M[i → j]" + (f"\n({note})" if note else ""), fontsize=10)
        return fig
    if "depth_mass" in ds and finite(ds["depth_mass"]):
        # sublayers without depth attention are all-NaN rows: drop them; sources as rows keeps cells square
        dm = ds["depth_mass"].dropna("sublayer", how="all").transpose("depth_source", "sublayer")
        fig, ax = subplots(size=(min(12.0, 2.5 + 0.45 * dm.sizes["sublayer"]), 2.6 + 0.4 * dm.sizes["depth_source"]))
        ax = ax[0, 0]
        plots.heatmap(dm, ax, vmin=0.0, vmax=max(span(dm.values)[1], 1e-6), cmap="viridis")
        ax.set_title(f"{heading(e)}\nMoDA depth-attention mass (no residual mix)", fontsize=10)
        return fig
    return None

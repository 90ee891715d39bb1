"""The angular distances of one checkpoint: a heatmap over start layer ℓ and block size n.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depthlens.plotting import plots
from depthlens.plotting.panels import Entry, finite, heading, subplots


def fig_angular(ds: xr.Dataset, e: Entry) -> Any:
    """Angular distance d(h_ℓ, h_{ℓ+n}) over start state ℓ and block size n ≥ 1 (invalid ℓ+n > L blank)."""
    da = ds["angular_distance"].isel(block_size=slice(1, None))
    fig, ax = subplots()
    ax = ax[0, 0]
    plots.heatmap(
        da,
        ax,
        vmin=0.0,
        vmax=max(0.5, float(np.nanmax(da.values))) if finite(da) else 1.0,
        cmap="magma",
        annot=max(da.shape) <= 5,
    )
    ax.set_title(f"{heading(e)}\nangular distance d(h_ℓ, h_ℓ+n), all positions", fontsize=10)
    return fig

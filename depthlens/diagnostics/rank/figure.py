"""One HC/mHC checkpoint's effective rank: the window profile and the single-sublayer maps.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depthlens.plotting.panels import Entry, design_color, heading, subplots


def fig_rank(ds: xr.Dataset, e: Entry) -> Any:
    """Effective rank of w-sublayer window products (mean, IQR band) and of each sublayer's residual map."""
    fig, axes = subplots(2, size=(6.0, 4.4))
    ax0, ax1 = axes[0]
    w = np.asarray(ds["window"].values, dtype=float)
    win = ds["erank_window"]
    col = design_color(e.slug)
    ax0.plot(w, win.sel(statistic="mean").values, marker="o", color=col, label="mean over window starts")
    ax0.fill_between(
        w,
        win.sel(statistic="q25").values,
        win.sel(statistic="q75").values,
        color=col,
        alpha=0.25,
        label="token quartiles (q25–q75)",
    )
    n = int(ds["n_streams"].values) if "n_streams" in ds.coords else None
    if n:
        ax0.axhline(n, color="0.4", linestyle="--", linewidth=1, label=f"n = {n} streams (max)")
        ax1.axhline(n, color="0.4", linestyle="--", linewidth=1)
    full = float(ds["erank"].sel(product="full", statistic="mean").values)
    ax0.axhline(full, color=col, linestyle=":", linewidth=1, label=f"full product: {full:.2f}")
    ax0.set_xscale("log", base=2)
    ax0.set_xticks(w)
    ax0.set_xticklabels([str(int(x)) for x in w])
    ax0.set_xlabel("window width w (sublayers)")
    ax0.set_ylabel(f"{win.attrs.get('long_name', 'effective rank')} [1]", fontsize=8)
    ax0.set_ylim(0.9, (n or float(np.nanmax(win.values))) + 0.3)
    ax0.legend(frameon=False, fontsize="small")
    ax0.set_title("window profile", fontsize=10)
    sub = ds["erank_sublayer"]
    ax1.plot(sub["sublayer"].values, sub.values, marker=".", color=col)
    ax1.set_xlabel("sublayer j")
    ax1.set_ylabel(f"{sub.attrs.get('long_name', 'effective rank')} [1]", fontsize=8)
    ax1.set_ylim(0.9, (n or float(np.nanmax(sub.values))) + 0.3)
    ax1.set_title("single-sublayer residual maps", fontsize=10)
    fig.suptitle(f"{heading(e)}: effective rank of residual-mixing products", fontsize=11)
    return fig

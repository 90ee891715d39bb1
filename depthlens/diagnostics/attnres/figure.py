"""One AttnRes checkpoint's self-weight per layer (with its dead prefix) and α per sublayer over its sources.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depthlens.plotting import plots
from depthlens.plotting.panels import Entry, design_color, finite, heading, subplots


def fig_attnres(ds: xr.Dataset, e: Entry) -> Any:
    """Self-weight s_ℓ per layer (with ε = 0.05 and the dead prefix k*) and α per sublayer over sources."""
    fig, axes = subplots(2, size=(6.4, 5.2))
    ax0, ax1 = axes[0]
    sw = ds["self_weight"]
    layers = sw["layer"].values
    vals = np.asarray(sw.values, dtype=float)
    ax0.bar(layers, np.nan_to_num(vals, nan=0.0), color=design_color(e.slug), label="self-weight s_ℓ")
    ax0.axhline(0.05, color="0.3", linestyle="--", linewidth=1, label="ε = 0.05")
    kstar = None
    if "dead_prefix" in ds:
        eps = np.asarray(ds["eps"].values, dtype=float)
        k = int(np.argmin(np.abs(eps - 0.05)))
        kstar = int(ds["dead_prefix"].values[k])
        if kstar > 0:
            ax0.axvspan(-0.5, kstar - 0.5, color="0.85", zorder=0, label=f"dead prefix k*(0.05) = {kstar}")
    ax0.set_xlabel("layer ℓ")
    ax0.set_ylabel(f"{sw.attrs.get('long_name', 'self-weight')} [{sw.attrs.get('units', '1')}]", fontsize=8)
    ax0.set_ylim(0, max(1.0, float(np.nanmax(vals)) if finite(vals) else 1.0))
    ax0.set_xticks(layers)
    ax0.legend(frameon=False, fontsize="small")
    ax0.set_title("self-weight per layer" + (f" (k* = {kstar})" if kstar is not None else ""), fontsize=10)
    src = ds["source_weight"]
    self_col = ds["self_weight_sublayer"].expand_dims(source=["self"]).transpose("sublayer", "source")
    alpha = xr.concat([src.assign_coords(source=[str(s) for s in src["source"].values]), self_col], dim="source")
    alpha.attrs = {"long_name": "depth-softmax weight α", "units": "1"}
    plots.heatmap(alpha, ax1, vmin=0.0, vmax=1.0, cmap="viridis")
    for lab in ax1.get_xticklabels():  # source names (emb, attn_3, mlp_3, block_2, ...) need the room
        lab.set_rotation(90)
    ax1.set_ylabel("sublayer j (2ℓ = attention, 2ℓ+1 = MLP)")
    ax1.set_xlabel("source (completed blocks / sublayer outputs; self = current partial)")
    ax1.set_title("α per sublayer over its sources", fontsize=10)
    fig.suptitle(f"{heading(e)}: AttnRes depth-attention weights", fontsize=11)
    return fig

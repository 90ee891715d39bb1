"""One checkpoint's lens curves: KL to the final layer and top-1 agreement over relative depth, with its twin.

The registry's `figure` hook (conventions: plotting/panels.py); `render/figures.py` writes it to a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depthlens.plotting.panels import Entry, heading, subplots


def draw_lens(axes: Any, ds: xr.Dataset, label: str, color: Any = None, dashed: bool = False) -> None:
    """KL (axes[0]) and top-1 agreement (axes[1]) of one lens Dataset against relative depth, with bands."""
    d = np.asarray(ds["depth"].values, dtype=float)
    for ax, var in zip(axes, ("lens_kl", "top1_agree")):
        y = ds[var].values
        lo, hi = ds[f"{var}_ci"].values.T
        (line,) = ax.plot(d, y, "--" if dashed else "-", marker=".", color=color, label=label)
        ax.fill_between(d, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)


def fig_lens(ds: xr.Dataset, e: Entry) -> Any:
    """One checkpoint's lens figure (the `logit_lens` / `tuned_lens` registry hook): trained, and its untrained
    twin when the report computed it."""

    kind = str(ds.attrs.get("kind", "logit"))
    fig, axs = subplots(2, 1, size=(5.2, 4.0))
    ax_kl, ax_ag = axs[0]
    draw_lens((ax_kl, ax_ag), ds, "trained", color="C0")
    twin = e.untrained.get(f"{kind}_lens")
    if twin is not None:
        draw_lens((ax_kl, ax_ag), twin, "untrained twin", color="C7", dashed=True)
    at = float(ds["forms_depth"].attrs.get("forms_at", 0.5))
    ax_ag.axhline(at, color="k", lw=0.6, ls=":")
    forms = float(ds["forms_depth"])
    if np.isfinite(forms):
        ax_ag.axvline(forms, color="C0", lw=0.8, ls=":")
    ax_kl.set(xlabel="relative depth l / L", ylabel="KL(p_final ‖ q_l) [nat]", yscale="symlog")
    ax_kl.set_yscale("symlog", linthresh=1e-2)
    ax_ag.set(xlabel="relative depth l / L", ylabel="top-1 agreement with the final layer", ylim=(0, 1.02))
    ax_kl.legend(fontsize=8)
    fig.suptitle(f"{heading(e)}\n{kind} lens: KL to the final layer and top-1 agreement", fontsize=10)
    fig.tight_layout()
    return fig

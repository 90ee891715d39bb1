"""Each diagnostic's figure of one checkpoint (the registry's `figure` hooks): heatmaps of C(s, t), P_abs and
the angular distances, AttnRes weights, effective-rank profiles, depth mixing and the lens curves. Drawn from
`depthlens.plotting` (a layer below), so no diagnostic depends on the report layer; `render/figures.py` writes
them to files and draws the cross-checkpoint figures.

Every figure has a title, labelled axes (heatmaps: from the coordinates' `long_name`) and, for heatmaps, a colour
bar labelled `long_name [units]` spanning the data: a log (or symmetric-log) scale where values span orders of
magnitude, blank (masked) cells where a value is undefined. Nothing here calls `plt.show()`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depthlens.plotting import plots
from depthlens.plotting.panels import (
    LOG_FLOOR,
    MIXING_LINTHRESH,
    Entry,
    causal_scale,
    design_color,
    finite,
    heading,
    span,
    subplots,
)
from depthlens.stats.metrics import late_window

from .scores import CAUSAL, PERM_ABS


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

"""Report figures: per-checkpoint heatmaps and profiles, cross-checkpoint share curves, depth summaries and
overview grids. Built on `depthlens.render.plots` (heatmap, share_curves, save_figure); what plots.py
lacks (bar/profile panels, grids, design colours) lives here.

Every figure has a title, labelled axes (heatmaps: from the coordinates' `long_name`) and, for heatmaps, a
colour bar labelled `long_name [units]` from the data that spans the data's range: a log (or symmetric-log)
scale where values span orders of magnitude, blank (masked) cells where a value is undefined. Files are written atomically by `plots.save_figure` (temp file, then rename). Callers select the
backend (the CLI uses Agg); nothing here calls `plt.show()`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import xarray as xr

from depthlens.designs import DESIGNS, SLUGS
from depthlens.diagnostics import registry
from depthlens.render import plots
from depthlens.stats.metrics import late_window

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from numpy.typing import ArrayLike

# studies.study.Entry and studies.report.Report: render sits below studies (tests/test_architecture.py), so they
# are named here for the signatures, not imported
Entry: TypeAlias = Any
Report: TypeAlias = Any

DPI = 100
CAUSAL_VMAX = 1.5  # end of the causal θ grid: a larger maximum draws C on a log scale
LOG_FLOOR = 1e-2  # lower end of a log colour scale (C, |M|): smaller values take the lowest colour
MIXING_LINTHRESH = 1e-2  # symlog for M: linear within ±0.01 (negligible weights), decades beyond


def design_color(slug: str) -> tuple[float, float, float, float]:
    """A fixed colour per design (tab10 in registry order), so every figure uses the same legend."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    k = SLUGS.index(slug) if slug in SLUGS else len(SLUGS)
    return cmap(k % 10)


def design_name(slug: str) -> str:
    return DESIGNS[slug].name if slug in DESIGNS else slug


def _finite(a: ArrayLike) -> bool:
    return bool(np.isfinite(np.asarray(a, dtype=float)).any())


def _span(values: ArrayLike, floor: float = 1e-6) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    return (lo, hi) if hi - lo > floor else (lo - 0.5 * max(abs(lo), 1.0) * 1e-3 - floor, hi + floor)


def _subplots(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.4, 5.2), **kw: Any) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kw)


def _heading(e: Entry) -> str:
    return f"{e.name} — {design_name(e.slug)}, L = {e.n_layer}, d = {e.d_model}"


# ---------------------------------------------------------------------------------------------------------------
# per checkpoint


def fig_angular(ds: xr.Dataset, e: Entry) -> Any:
    """Angular distance d(h_ℓ, h_{ℓ+n}) over start state ℓ and block size n ≥ 1 (invalid ℓ+n > L blank)."""
    da = ds["angular_distance"].isel(block_size=slice(1, None))
    fig, ax = _subplots()
    ax = ax[0, 0]
    plots.heatmap(
        da,
        ax,
        vmin=0.0,
        vmax=max(0.5, float(np.nanmax(da.values))) if _finite(da) else 1.0,
        cmap="magma",
        annot=max(da.shape) <= 5,
    )
    ax.set_title(f"{_heading(e)}\nangular distance d(h_ℓ, h_ℓ+n), all positions", fontsize=10)
    return fig


def causal_scale(top: float) -> dict[str, Any]:
    """Colour scale of C: linear [0, max(1, top)] up to CAUSAL_VMAX; beyond, one outlier (C ≫ 1) would wash out
    the rest, so log [LOG_FLOOR, top] (smaller C take the lowest colour)."""
    if top > CAUSAL_VMAX:
        return {"vmin": LOG_FLOOR, "vmax": top, "scale": "log", "extend": "min"}
    return {"vmin": 0.0, "vmax": max(1.0, top), "scale": "linear", "extend": "neither"}


def fig_causal(ds: xr.Dataset, e: Entry, share: float | None = None) -> Any:
    """C(s, t) (current variant, max aggregator) for the skipped layers (rows) and measured layers (cols)."""
    from depthlens.diagnostics.sweep import score_matrix

    da = score_matrix(ds, "causal", "max", "current")
    computed = [int(l) for l in da["layer"].values if _finite(da.sel(layer=l).values)]
    if computed:
        # rows: the skipped layers that were run; columns from the first of them (earlier t are undefined)
        da = da.sel(layer=computed, layer_other=[int(t) for t in da["layer_other"].values if t >= computed[0]])
    da = plots.upper_triangle(da)  # t < s is undefined (NaN): blank, not the colour of "no effect"
    fig, ax = _subplots()
    ax = ax[0, 0]
    top = float(np.nanmax(da.values)) if _finite(da) else 1.0
    sc = causal_scale(top)
    plots.heatmap(da, ax, cmap="viridis", annot=max(da.shape) <= 8 and sc["scale"] == "linear", **sc)
    extra = "" if share is None else f" · share > {registry.CAUSAL.theta:g}: {share:.2f}"
    if sc["scale"] == "log":
        extra += f"\n(log colour scale: max C = {top:.3g}; C < {LOG_FLOOR:g} in the lowest colour)"
    ax.set_title(f"{_heading(e)}\ncausal score C(s, t), current/max{extra}", fontsize=10)
    return fig


def fig_permutation(ds: xr.Dataset, e: Entry, share: float | None = None) -> Any:
    """P_abs(i, j) on the late window (diverging scale about 0: a swap can also lower the loss)."""
    a = int(ds.attrs.get("late_window_start", late_window(e.n_layer)))
    da = ds["perm_abs"].isel(layer=slice(a, None), layer_other=slice(a, None))
    lo, hi = _span(da.values)
    radius = max(abs(lo), abs(hi), 1e-3)
    fig, ax = _subplots()
    ax = ax[0, 0]
    plots.heatmap(da, ax, vmin=-radius, vmax=radius, center=0.0, cmap="vlag", annot=max(da.shape) <= 8)
    extra = "" if share is None else f" · share > {registry.PERM_ABS.theta:g} nat: {share:.2f}"
    ax.set_title(f"{_heading(e)}\npermutation P_abs, late window{extra}", fontsize=10)
    return fig


def fig_mixing(ds: xr.Dataset, e: Entry) -> Any | None:
    """M[i → j] (token mean); MoDA: depth-attention mass per sublayer instead. None if neither exists."""
    da = ds["depth_mixing"]
    if _finite(da):
        # source i (the output of sublayer i−1) exists only for destinations j ≥ i: the rest is undefined
        da = plots.upper_triangle(da)
        fig, ax = _subplots()
        ax = ax[0, 0]
        lo, hi = _span(da.values)
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
        ax.set_title(f"{_heading(e)}\ndepth-mixing matrix M[i → j]" + (f"\n({note})" if note else ""), fontsize=10)
        return fig
    if "depth_mass" in ds and _finite(ds["depth_mass"]):
        # sublayers without depth attention are all-NaN rows: drop them; sources as rows keeps cells square
        dm = ds["depth_mass"].dropna("sublayer", how="all").transpose("depth_source", "sublayer")
        fig, ax = _subplots(size=(min(12.0, 2.5 + 0.45 * dm.sizes["sublayer"]), 2.6 + 0.4 * dm.sizes["depth_source"]))
        ax = ax[0, 0]
        plots.heatmap(dm, ax, vmin=0.0, vmax=max(_span(dm.values)[1], 1e-6), cmap="viridis")
        ax.set_title(f"{_heading(e)}\nMoDA depth-attention mass (no residual mix)", fontsize=10)
        return fig
    return None


def fig_attnres(ds: xr.Dataset, e: Entry) -> Any:
    """Self-weight s_ℓ per layer (with ε = 0.05 and the dead prefix k*) and α per sublayer over sources."""
    fig, axes = _subplots(2, size=(6.4, 5.2))
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
    ax0.set_ylim(0, max(1.0, float(np.nanmax(vals)) if _finite(vals) else 1.0))
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
    fig.suptitle(f"{_heading(e)}: AttnRes depth-attention weights", fontsize=11)
    return fig


def fig_rank(ds: xr.Dataset, e: Entry) -> Any:
    """Effective rank of w-sublayer window products (mean, IQR band) and of each sublayer's residual map."""
    fig, axes = _subplots(2, size=(6.0, 4.4))
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
    fig.suptitle(f"{_heading(e)}: effective rank of residual-mixing products", fontsize=11)
    return fig


def checkpoint_figures(e: Entry, fig_dir: Path, record: dict[str, Any] | None = None) -> dict[str, str]:
    """Write every figure of one checkpoint; returns {metric: 'figures/<file>.png'}. `record` (its row of
    summary.json, from `build.record`) supplies the headline shares shown in the heatmap titles."""
    record = record or {}
    shares = {d.name: record.get(f"{d.prefix}_share") for d in registry.diagnostics() if d.scores}
    out: dict[str, str] = {}
    for d in registry.diagnostics():
        metric, ds = d.name, e.datasets.get(d.name)
        if ds is None or d.figure is None:
            continue
        draw = registry.resolve(d.figure)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices in masked triangles
            fig = draw(ds, e, share=shares.get(metric)) if d.headline else draw(ds, e)
        if fig is None:
            e.notes.append(f"{metric}: nothing to plot")
            continue
        fname = f"{e.name}_{metric}.png"
        plots.save_figure(fig, fig_dir / fname, dpi=DPI)
        out[metric] = f"figures/{fname}"
    return out


# ---------------------------------------------------------------------------------------------------------------
# across checkpoints


def _depths(sw: xr.Dataset) -> list[int]:
    return sorted({int(v) for v in sw["n_layer"].values})


def fig_share_curves(sw: xr.Dataset, metric: str) -> Any:
    """S(θ) per checkpoint, one panel per depth, headline θ dashed, colours by design."""
    d = registry.get(metric)
    score = d.headline
    assert score is not None
    depths = _depths(sw)
    fig, axes = _subplots(len(depths), size=(5.0, 4.0), sharey=True)
    h = float(sw.attrs["headline_threshold"])
    seen: dict[str, Any] = {}
    for ax, L in zip(axes[0], depths):
        names = [str(n) for n, l in zip(sw["checkpoint"].values, sw["n_layer"].values) if int(l) == L]
        slugs = {str(n): str(d) for n, d in zip(sw["checkpoint"].values, sw["design"].values)}
        names.sort(key=lambda n: (SLUGS.index(slugs[n]) if slugs[n] in SLUGS else 99, n))
        curves = {n: sw["share"].sel(checkpoint=n).drop_vars(["design", "n_layer"]) for n in names}
        plots.share_curves(curves, headline=h, ax=ax, logx=score.grid.kind == "log")
        lines = ax.get_lines()
        for line, n in zip(lines, names):
            line.set_color(design_color(slugs[n]))
            line.set_label(design_name(slugs[n]))
            seen.setdefault(design_name(slugs[n]), line)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        ax.set_xlabel(score.theta_label)
        ax.set_ylabel("share of late pairs with score > θ [1]")
        ax.set_title(f"L = {L}")
    fig.suptitle(f"threshold sweep: {d.title} (headline θ = {h:g}, dashed)", fontsize=11)
    fig.legend(
        list(seen.values()),
        list(seen.keys()),
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        frameon=False,
        fontsize="small",
    )
    fig.tight_layout()
    return fig


def fig_summary(records: list[dict[str, Any]]) -> Any:
    """Validation loss and the two headline shares (95% bootstrap CI) against depth, one line per design."""
    scores = [(d.prefix, d.headline) for d in registry.diagnostics() if d.headline]
    panels = (
        ("val_loss", None, None, "validation loss [nat/token]"),
        *(
            (
                f"{p}_share",
                f"{p}_ci_low",
                f"{p}_ci_high",
                f"share {s.symbol} > {s.theta:g}{'' if s.unit == '1' else ' ' + s.unit} [1]",
            )
            for p, s in scores
        ),
    )
    fig, axes = _subplots(len(panels), size=(4.6, 3.8))
    slugs = [s for s in SLUGS if any(r["design"] == s for r in records)]
    slugs += sorted({r["design"] for r in records} - set(slugs))
    depths = sorted({r["n_layer"] for r in records})
    handles: dict[str, Any] = {}
    for ax, (key, lo, hi, label) in zip(axes[0], panels):
        for k, s in enumerate(slugs):
            rows = sorted(
                (r for r in records if r["design"] == s and r.get(key) is not None), key=lambda r: r["n_layer"]
            )
            if not rows:
                continue
            x = np.array([r["n_layer"] for r in rows], dtype=float) * (1 + 0.012 * (k - len(slugs) / 2))
            y = np.array([r[key] for r in rows], dtype=float)
            if lo is not None:
                assert hi is not None  # the panels name both interval ends or neither
                yl = np.array([r[lo] if r.get(lo) is not None else r[key] for r in rows], dtype=float)
                yh = np.array([r[hi] if r.get(hi) is not None else r[key] for r in rows], dtype=float)
                line = ax.errorbar(
                    x,
                    y,
                    yerr=np.clip([y - yl, yh - y], 0, None),
                    marker="o",
                    capsize=2,
                    color=design_color(s),
                    label=design_name(s),
                )
            else:
                line = ax.plot(x, y, marker="o", color=design_color(s), label=design_name(s))[0]
            handles.setdefault(design_name(s), line)
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths)
        ax.set_xticklabels([str(d) for d in depths])
        ax.set_xlabel("depth L (layers)")
        ax.set_ylabel(label)
        if lo is not None:
            ax.set_ylim(-0.03, 1.03)
        ax.set_title(label.split(" [")[0], fontsize=10)
    fig.suptitle("does depth turn into computation? headline numbers by design and depth", fontsize=11)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles.keys()),
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            frameon=False,
            fontsize="small",
        )
    fig.tight_layout()
    return fig


def fig_overview(entries: Sequence[Entry], metric: str) -> Any | None:
    """Grid of the causal (or permutation) heatmaps: rows = designs, columns = depths, one shared colour bar."""
    import seaborn  # noqa: F401  (registers the "vlag" colour map used below; no other figure may have yet)

    from depthlens.diagnostics.sweep import score_matrix

    have = [e for e in entries if metric in e.datasets]
    if not have:
        return None
    slugs = [s for s in SLUGS if any(e.slug == s for e in have)]
    slugs += sorted({e.slug for e in have} - set(slugs))
    depths = sorted({e.n_layer for e in have})
    # constrained layout: the title, the panels and the colour bar packed without the default margins' dead space
    fig, axes = _subplots(len(slugs), len(depths), size=(1.7, 1.75), layout="constrained")
    score = registry.get(metric).headline
    assert score is not None

    def late(e: Entry) -> np.ndarray:
        """The late-window block of the panel's matrix (causal: t < s, undefined, as NaN)."""
        ds, a = e.datasets[metric], late_window(e.n_layer)
        m = np.asarray(
            score_matrix(ds, score.key, score.select.get("aggregator"), score.select.get("variant")).values, float
        ).copy()
        if metric == "causal":
            m[np.tril_indices_from(m, k=-1)] = np.nan
        return m[a:, a:]

    vals = np.concatenate([late(e).ravel() for e in have])
    if metric == "causal":  # the colour bar spans the data: scores above 1 are common
        sc = causal_scale(float(np.nanmax(vals)) if _finite(vals) else 1.0)
        norm = plots.color_norm(sc["scale"], sc["vmin"], sc["vmax"])
        cmap, extend = "viridis", sc["extend"]
        label = "causal score C(s,t), current/max [1]" + (" (log scale)" if sc["scale"] == "log" else "")
    else:
        r = max(float(np.nanmax(np.abs(vals))) if _finite(vals) else 1e-3, 1e-3)
        norm, cmap, extend = plots.color_norm("linear", -r, r), "vlag", "neither"
        label = "swap loss increase P_abs [nat]" if metric == "permutation" else f"{score.label} [{score.unit}]"
    im = None
    for i, L in enumerate(depths):
        a = late_window(L)
        for j, s in enumerate(slugs):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            match = [e for e in have if e.slug == s and e.n_layer == L]
            if j == 0:
                ax.set_ylabel(f"L = {L}", fontsize=10)
            if i == 0:
                ax.set_title(design_name(s), fontsize=9)
            if not match:
                ax.set_facecolor("0.95")
                ax.text(0.5, 0.5, "—", ha="center", va="center", transform=ax.transAxes, color="0.5")
                continue
            m = late(match[0])
            im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=norm, interpolation="nearest", aspect="equal")
            n = m.shape[0]  # layer ticks: the window's first and last layer
            ax.set_xticks([0, n - 1], [str(a), str(L - 1)], fontsize=6)
            ax.set_yticks([0, n - 1], [str(a), str(L - 1)], fontsize=6)
            ax.tick_params(length=2, pad=1)
    if im is not None:
        theta, line = score.theta, "white" if metric == "causal" else "0.2"
        # the headline θ as a line on the bar, named in the bar's label (a text beside it overlapped the panels)
        label += f"; {'white' if metric == 'causal' else 'dark'} line: θ = {theta:g}"
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), label=label, shrink=0.8, extend=extend, pad=0.01, aspect=30)
        cb.ax.axhline(theta, color=line, linewidth=1.5)
    what = {"causal": "causal score (skipped s → measured t)", "permutation": "permutation P_abs (i, j)"}.get(
        metric, f"{score.label} (i, j)"
    )
    within = "rows s, columns t" if metric == "causal" else "rows i, columns j"
    fig.suptitle(
        f"overview: {what} on the late window ⌊L/4⌋…L−1\n(panel rows: depth, columns: design; in a "
        f"panel {within}, ticks: first and last layer)",
        fontsize=11,
    )
    return fig


def cross_figures(rep: Report, fig_dir: Path) -> dict[str, str]:
    """Share curves per metric, the depth summary and the overview grids; returns {key: relative path}."""
    out: dict[str, str] = {}
    jobs: list[tuple[str, Callable[[], Any]]] = []
    for metric, sw in rep.sweeps.items():
        jobs.append((f"sweep_{metric}", functools.partial(fig_share_curves, sw, metric)))
    if rep.records:
        jobs.append(("summary", lambda: fig_summary(rep.records)))
    for metric in (d.name for d in registry.diagnostics() if d.headline):
        if any(metric in e.datasets for e in rep.entries):
            jobs.append((f"overview_{metric}", functools.partial(fig_overview, rep.entries, metric)))
    for key, make in jobs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", UserWarning)  # tight_layout with outside legends
            fig = make()
            if fig is None:
                continue
            plots.save_figure(fig, fig_dir / f"{key}.png", dpi=DPI)
        out[key] = f"figures/{key}.png"
    return out

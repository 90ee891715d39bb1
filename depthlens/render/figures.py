"""Report figures: each checkpoint's diagnostic figures written to files (drawn by the registry's figure hooks,
`diagnostics/<name>/figure.py`), and the cross-checkpoint share curves, depth summaries and overview grids. Built on
`depthlens.plotting` (heatmap, share_curves, save_figure, the shared panels).

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
from typing import Any, cast

import numpy as np
import xarray as xr

from depthlens.designs import SLUGS
from depthlens.diagnostics import registry
from depthlens.diagnostics.spec import ScoredFigure
from depthlens.plotting import plots
from depthlens.plotting.panels import (
    DPI,
    Entry,
    Report,
    causal_scale,
    design_color,
    design_name,
    finite,
    legend_right,
    subplots,
)
from depthlens.stats.metrics import late_window


def checkpoint_figures(e: Entry, fig_dir: Path, record: dict[str, Any] | None = None) -> dict[str, str]:
    """Write every figure of one checkpoint; returns {metric: 'figures/<file>.png'}. `record` (its row of
    summary.json, from `build.record`) supplies the headline shares shown in the heatmap titles."""
    record = record or {}
    shares = {d.name: record.get(f"{d.prefix}_share") for d in registry.diagnostics() if d.scores}
    out: dict[str, str] = {}
    for d in registry.diagnostics():
        metric, ds = d.name, e.datasets.get(d.name)
        draw = d.loaded().figure
        if ds is None or draw is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices in masked triangles
            fig = cast(ScoredFigure, draw)(ds, e, share=shares.get(metric)) if d.headline else draw(ds, e)
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
    fig, axes = subplots(len(depths), size=(5.0, 4.0), sharey=True)
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
    legend_right(fig, seen)
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
    fig, axes = subplots(len(panels), size=(4.6, 3.8))
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
    legend_right(fig, handles)
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
    fig, axes = subplots(len(slugs), len(depths), size=(1.7, 1.75), layout="constrained")
    score = registry.get(metric).headline
    assert score is not None
    view = score.view

    def late(e: Entry) -> np.ndarray:
        """The late-window block of the panel's matrix (undefined entries below the diagonal as NaN)."""
        ds, a = e.datasets[metric], late_window(e.n_layer)
        m = np.asarray(
            score_matrix(ds, score.key, score.select.get("aggregator"), score.select.get("variant")).values, float
        ).copy()
        if view.upper_only:
            m[np.tril_indices_from(m, k=-1)] = np.nan
        return m[a:, a:]

    vals = np.concatenate([late(e).ravel() for e in have])
    label = view.bar_label or f"{score.label} [{score.unit}]"
    if view.colour == "span":  # the colour bar spans the data
        sc = causal_scale(float(np.nanmax(vals)) if finite(vals) else 1.0)
        norm = plots.color_norm(sc["scale"], sc["vmin"], sc["vmax"])
        cmap, extend = "viridis", sc["extend"]
        label += " (log scale)" if sc["scale"] == "log" else ""
    else:
        r = max(float(np.nanmax(np.abs(vals))) if finite(vals) else 1e-3, 1e-3)
        norm, cmap, extend = plots.color_norm("linear", -r, r), "vlag", "neither"
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
        # the headline θ as a line on the bar, named in the bar's label (a text beside it overlapped the panels);
        # white on viridis, dark on vlag
        theta, (line, line_name) = score.theta, ("white", "white") if view.colour == "span" else ("0.2", "dark")
        label += f"; {line_name} line: θ = {theta:g}"
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), label=label, shrink=0.8, extend=extend, pad=0.01, aspect=30)
        cb.ax.axhline(theta, color=line, linewidth=1.5)
    what = view.title or f"{score.label} (i, j)"
    within = f"rows {view.axes[0]}, columns {view.axes[1]}"
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

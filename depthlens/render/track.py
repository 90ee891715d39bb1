"""Depth over training: the figure and the Markdown section of a `depthlens track` dataset.

fig_track(ds)          rows: each tracked headline share, then the diagnostics' other panels (`figure_rows`: the
                       shares, then `Diagnostic.track_panels`, those present);
                       columns: depth L; one line per run (design colour) with its 95% bootstrap CI band,
                       validation loss dashed on a twin axis; x = training tokens (symlog: init at 0).
track_markdown(ds)     a "Depth over training" section: one row per run, first → last snapshot (columns: each
                       share, then `Diagnostic.track_columns`, those present).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import xarray as xr

from depthlens.designs import SLUGS
from depthlens.diagnostics import registry
from depthlens.plotting.panels import design_color, design_name


def share_label(ds: xr.Dataset, d: registry.Diagnostic) -> str:
    """'C > θ', 'P_abs > θ nat': a tracked headline share's threshold, the run's own (`<prefix>_threshold`)."""
    score = d.headline
    assert score is not None
    theta = float(ds.attrs.get(f"{d.prefix}_threshold", score.theta))
    return f"{score.symbol} > {theta:g}" + ("" if score.unit == "1" else f" {score.unit}")


def shared(ds: xr.Dataset) -> list[registry.Diagnostic]:
    """The diagnostics whose headline share the run tracked (`<prefix>_share`), in registry order."""
    return [d for d in registry.diagnostics() if d.headline is not None and f"{d.prefix}_share" in ds]


def figure_rows(ds: xr.Dataset) -> list[tuple[str, str, str | None, dict[str, str]]]:
    """(variable, y label, CI prefix or None, coordinates to pick): each tracked headline share (with its CI band),
    then the diagnostics' other panels (`Diagnostic.track_panels`), in registry order."""
    rows: list[tuple[str, str, str | None, dict[str, str]]] = [
        (f"{d.prefix}_share", f"share of late pairs\n{share_label(ds, d)}", d.prefix, {}) for d in shared(ds)
    ]
    numbers = {k: float(v) for k, v in ds.attrs.items() if isinstance(v, (int, float, np.number))}
    for d in registry.diagnostics():
        rows += [(p.var, p.label.format(**numbers), None, dict(p.select)) for p in d.track_panels if p.var in ds]
    return rows


def _zoo_eval_size() -> str:
    """The committed zoo report's eval size, from its manifest (reports/zoo/manifest.json `options`)."""
    import json
    from pathlib import Path

    m = Path(__file__).resolve().parents[2] / "reports" / "zoo" / "manifest.json"
    try:
        o = json.loads(m.read_text(encoding="utf-8")).get("options", {})
    except (OSError, ValueError):
        return "see its eval line"
    n, p = o.get("n_seq"), o.get("perm_n_seq")
    return (
        f"{n} sequences" + (f", the permutation on the first {p}" if p and p != n else "") if n else "see its eval line"
    )


def _x(ds: xr.Dataset, run: str) -> tuple[np.ndarray, str]:
    """Training tokens when known for every snapshot of the run, else the step."""
    tok = np.asarray(ds["tokens"].sel(run=run).values, dtype=float)
    step = np.asarray(ds["step"].values, dtype=float)
    have = _have(ds, run)
    if have.any() and np.isfinite(tok[have]).all():
        return tok, "training tokens"
    return step, "step"


def _have(ds: xr.Dataset, run: str) -> np.ndarray:
    """Which steps of the shared `step` axis this run has a snapshot at (runs are outer-joined on step)."""
    have: np.ndarray = np.asarray(ds["snapshot"].sel(run=run).values).astype(str) != ""
    return have


def _row_values(ds: xr.Dataset, var: str, run: str, select: dict[str, str]) -> np.ndarray:
    da = ds[var].sel(run=run)
    for dim, value in select.items():
        if dim in da.dims:
            da = da.sel({dim: value}) if value in da[dim].values else da.isel({dim: 0})
    return np.asarray(da.values, dtype=float)


def _linthresh(ds: xr.Dataset) -> float:
    """The smallest positive x over all runs (tokens, else steps): the end of symlog's linear part."""
    xs = np.concatenate([_x(ds, str(r))[0] for r in ds["run"].values])
    pos = xs[np.isfinite(xs) & (xs > 0)]
    return float(pos.min()) if pos.size else 1.0


def fig_track(ds: xr.Dataset) -> Any:
    """The share-vs-tokens figure (a matplotlib Figure; the caller saves it)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows = [r for r in figure_rows(ds) if np.isfinite(np.asarray(ds[r[0]].values, dtype=float)).any()]
    if not rows:  # no share or other series to draw (e.g. --metric angular): the validation loss alone
        rows = [("val_loss", "validation loss [nat]", None, {})]
    depths = sorted({int(L) for L in ds["n_layer"].values})
    fig, axes = plt.subplots(
        len(rows), len(depths), figsize=(5.6 * len(depths), 3.4 * len(rows)), squeeze=False, sharex="col"
    )
    xlabel = "step"
    for c, L in enumerate(depths):
        runs = [str(r) for r, n in zip(ds["run"].values, ds["n_layer"].values) if int(n) == L]
        for r, (var, ylabel, ci, select) in enumerate(rows):
            ax = axes[r, c]
            twin = ax.twinx() if var != "val_loss" and r < 2 else None
            for run in runs:
                slug = str(ds["design"].sel(run=run).values)
                x, xlabel = _x(ds, run)
                y = _row_values(ds, var, run, select)
                ok = np.isfinite(x) & np.isfinite(y) & (x >= 0)
                if not ok.any():
                    continue
                col = design_color(slug)
                ax.plot(x[ok], y[ok], marker="o", ms=3, color=col, label=design_name(slug))
                if ci is not None:
                    lo, hi = (
                        np.asarray(ds[f"{ci}_ci_{b}"].sel(run=run).values, dtype=float)[ok] for b in ("low", "high")
                    )
                    if np.isfinite(lo).any():
                        ax.fill_between(x[ok], lo, hi, color=col, alpha=0.12, linewidth=0)
                if twin is not None:
                    v = np.asarray(ds["val_loss"].sel(run=run).values, dtype=float)
                    okv = np.isfinite(x) & np.isfinite(v) & (x >= 0)
                    if okv.any():
                        twin.plot(x[okv], v[okv], linestyle="--", linewidth=1, color=col, alpha=0.7)
            # symlog: the step-0 snapshot (init) sits at 0, linear up to the first positive x, log beyond
            ax.set_xscale("symlog", linthresh=_linthresh(ds))
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor log labels collide on short ranges
            ax.set_ylabel(ylabel)
            if ci is not None:
                ax.set_ylim(-0.02, 1.02)
            if twin is not None:
                twin.set_ylabel("validation loss [nat] (dashed)")
            if r == 0:
                ax.set_title(f"L = {L}")
            if r == len(rows) - 1:
                ax.set_xlabel(f"{xlabel} (log; 0 = initialisation)")
    from matplotlib.lines import Line2D

    legend: dict[str, Any] = {}  # one entry per design over all panels, below the grid, in registry order
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    order = [design_name(slug) for slug in SLUGS]
    legend = dict(sorted(legend.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    legend["validation loss (right axis)"] = Line2D([], [], color="0.3", linestyle="--", linewidth=1)
    fig.suptitle("Depth over training: late-layer use per design (95% bootstrap CI over eval sequences)")
    fig.tight_layout(rect=(0, 0.04 if len(rows) > 1 else 0.08, 1, 1))
    fig.legend(
        list(legend.values()),
        list(legend),
        loc="lower center",
        ncol=min(len(legend), 6),
        frameon=False,
        fontsize="small",
    )
    return fig


def _fmt(v: Any, spec: str = ".2f") -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "—"
    return "—" if math.isnan(f) else format(f, spec)


def _share(ds: xr.Dataset, prefix: str, run: str, k: int) -> str:
    s = float(ds[f"{prefix}_share"].sel(run=run).values[k])
    lo, hi = (float(ds[f"{prefix}_ci_{b}"].sel(run=run).values[k]) for b in ("low", "high"))
    if math.isnan(s):
        return "—"
    ci = "" if math.isnan(lo) else f" [{100 * lo:.0f}, {100 * hi:.0f}]"
    return f"{100 * s:.0f}%{ci}"


def curve_summary(x: np.ndarray, y: np.ndarray) -> str:
    """The shape of a share over training in one cell: its lowest and highest value with the training tokens
    (or steps) where they occur, and the last minus the first (the change since initialisation when the
    first snapshot is step 0). Replaces 'tokens to reach half the final share', which read 0 whenever the
    share started high, dipped and recovered."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if y.size == 0:
        return "—"
    lo, hi = int(np.argmin(y)), int(np.argmax(y))
    return (
        f"min {100 * y[lo]:.0f}% at {_fmt(x[lo], '.3g')}, max {100 * y[hi]:.0f}% at {_fmt(x[hi], '.3g')}, "
        f"last − first {100 * (y[-1] - y[0]):+.0f} pts"
    )


def _change(ds: xr.Dataset, prefix: str, run: str) -> str:
    """The last snapshot minus the untrained step-0 one, with its paired interval (— without a step 0)."""
    if f"{prefix}_change" not in ds:
        return "—"
    v, lo, hi = (float(ds[f"{prefix}_change{t}"].sel(run=run).values) for t in ("", "_low", "_high"))
    if math.isnan(v):
        return "—"
    return f"{100 * v:+.0f} pts" + ("" if math.isnan(lo) else f" [{100 * lo:+.0f}, {100 * hi:+.0f}]")


def series_columns(ds: xr.Dataset) -> list[registry.TrackColumn]:
    """The diagnostics' table columns (`Diagnostic.track_columns`) whose series the run tracked, in registry order."""
    return [c for d in registry.diagnostics() for c in d.track_columns if c.var in ds]


def _other_dim(ds: xr.Dataset, col: registry.TrackColumn) -> str | None:
    return next((str(d) for d in ds[col.var].dims if d not in ("run", "step")), None)


def _series(ds: xr.Dataset, col: registry.TrackColumn, run: str, a: int, b: int) -> str:
    """`col`'s variable at snapshots a → b, each value of its other dimension (coordinate order) "/"-joined; — when
    neither has a finite value (a design the diagnostic does not apply to)."""
    e = np.asarray(ds[col.var].sel(run=run).values, dtype=float)  # (step[, other])
    if not np.isfinite(e[[a, b]]).any():
        return "—"
    return " → ".join("/".join(_fmt(v, col.fmt) for v in np.atleast_1d(e[k])) for k in (a, b))


def _series_head(ds: xr.Dataset, col: registry.TrackColumn, short: bool) -> str:
    if short:
        return f"{col.label}, first → last"
    dim = _other_dim(ds, col)
    if dim is None:
        return f"{col.what}, first → last"
    values = "/".join(str(v) for v in ds[dim].values) if dim in ds.coords else f"each {dim}"
    return f"{col.what} ({values}), first → last"


def track_rows(ds: xr.Dataset) -> list[list[str]]:
    out = []
    for run in (str(r) for r in ds["run"].values):
        steps = np.asarray(ds["step"].values)
        have = _have(ds, run)
        idx = np.flatnonzero(have)
        a, b = int(idx[0]), int(idx[-1])
        x, _ = _x(ds, run)
        row = [
            design_name(str(ds["design"].sel(run=run).values)),
            str(int(ds["n_layer"].sel(run=run))),
            run,
            f"{len(idx)} ({int(steps[a])}–{int(steps[b])})",
            f"{_fmt(x[a], '.3g')} → {_fmt(x[b], '.3g')}",
        ]
        for prefix in (d.prefix for d in shared(ds)):
            y = np.asarray(ds[f"{prefix}_share"].sel(run=run).values, dtype=float)
            row.append(
                f"{_share(ds, prefix, run, a)} → {_share(ds, prefix, run, b)}; {curve_summary(x[have], y[have])}"
            )
            row.append(_change(ds, prefix, run))
        row += [_series(ds, col, run, a, b) for col in series_columns(ds)]
        v = np.asarray(ds["val_loss"].sel(run=run).values, dtype=float)
        row.append(f"{_fmt(v[a])} → {_fmt(v[b])}")
        out.append(row)
    return out


def track_columns(ds: xr.Dataset, short: bool = False) -> list[str]:
    """The headers of `track_rows`' cells, one per cell in the same order (`short`: for a terminal table)."""
    head = ["design", "L", "run", "snapshots (steps)", "tokens first → last"]
    for label in (share_label(ds, d) for d in shared(ds)):
        head.append(
            f"share {label}, first → last"
            if short
            else f"share {label} [95%], first → last; min, max (at tokens), last − first"
        )
        head.append(
            f"{label}: trained − untrained"
            if short
            else f"{label}: trained − untrained (step 0) [95%, paired over sequences]"
        )
    head += [_series_head(ds, col, short) for col in series_columns(ds)]
    head.append("val loss first → last")
    return head


def track_markdown(ds: xr.Dataset, figure: str | None = "track.png", heading: str = "##") -> str:
    """The "Depth over training" report section."""
    head = track_columns(ds)
    lines = [
        f"{heading} Depth over training",
        "",
        "Every diagnostic on every training snapshot, on the same eval tokens "
        f"({ds.attrs.get('eval_n_seq', '?')} sequences × {ds.attrs.get('eval_seq_len', '?')} tokens, "
        f"sha256 {str(ds.attrs.get('eval_data_sha256', ''))[:12]}). Shares are over the late window "
        f"(layers ≥ ⌊L/4⌋) with a 95% interval over eval sequences (causal: the size-fixed share at ⌈N/2⌉ "
        "sequences, delete-one jackknife; permutation: bootstrap). The first snapshot (step 0) is the "
        "untrained model, so 'last − first' is the change training made. **Eval set:** these "
        f"{ds.attrs.get('eval_n_seq', '?')} sequences are not the zoo report's ({_zoo_eval_size()}): shares grow "
        "with the eval set (max aggregator), so the numbers here are not comparable with the zoo "
        "report's, only with each other.",
        "",
    ]
    if figure:
        lines += [f"![depth over training]({figure})", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in track_rows(ds)]
    pending = [s for s in json.loads(ds.attrs.get("series_json", "[]")) if s.get("pending")]
    notes = json.loads(ds.attrs.get("notes_json", "[]"))
    if pending or notes:
        lines.append("")
    for s in pending:
        lines.append(f"- {s['run']}: still training (steps {s['pending']} requested, not yet written)")
    for n in notes:
        lines.append(f"- {n}")
    return "\n".join(lines) + "\n"

"""Heatmaps and share curves from labelled DataArrays (docs/concepts.md#results), plus a terminal heatmap for the CLI.

Plot functions take DataArrays, draw on a given Axes (or a new one), and return the Axes. They never call
`plt.show()` and never select a backend: the CLI calls `matplotlib.use("Agg")`, notebooks stay interactive.
Labels come from the data: colour bar `long_name [units]`, axis labels from the coordinates' `long_name`
(the dimension name when a coordinate has none). Values that span orders of magnitude take `scale="log"` or
`"symlog"`; NaN cells (undefined, e.g. t < s of the causal matrix: `upper_triangle`) are left blank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import xarray as xr

if TYPE_CHECKING:  # typing only: matplotlib and rich are imported where a figure or a heatmap is drawn
    from matplotlib.axes import Axes
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType
    from rich.text import Text

SEABORN_MAX_SIZE = 16  # per-cell seaborn heatmaps up to L = 16; imshow beyond (faster, no per-cell artists)


def _label(da: xr.DataArray, fallback: Hashable = "") -> str:
    """`long_name [units]` from CF attrs (either part optional)."""
    name = da.attrs.get("long_name") or da.name or fallback
    units = da.attrs.get("units")
    return f"{name} [{units}]" if units else str(name)


def axis_label(da: xr.DataArray, dim: Hashable) -> str:
    """Axis label of `dim`: its coordinate's `long_name [units]`, else the dimension name."""
    if dim in da.coords and (da[dim].attrs.get("long_name") or da[dim].attrs.get("units")):
        return _label(da[dim], fallback=dim)
    return str(dim)


def upper_triangle(da: xr.DataArray, offset: int = 0) -> xr.DataArray:
    """`da` with the cells below the diagonal (column coordinate < row coordinate + offset) set to NaN: the
    undefined part of a (layer, layer_other) matrix such as C(s, t), t < s, which must not be drawn as 0."""
    rows, cols = da.dims
    r = np.asarray(da[rows].values if rows in da.coords else np.arange(da.sizes[rows]))
    c = np.asarray(da[cols].values if cols in da.coords else np.arange(da.sizes[cols]))
    keep = c[None, :] >= r[:, None] + offset
    return da.where(xr.DataArray(keep, dims=(rows, cols)))


def color_norm(
    scale: str, vmin: float | None, vmax: float | None, linthresh: float | None = None, center: float | None = None
) -> Normalize:
    """A matplotlib Normalize for `scale` linear | log | symlog (log: vmin > 0 needed; symlog: linear within
    ±linthresh of 0, default 1e-2 × max |v|)."""
    from matplotlib import colors

    if scale == "log":
        return colors.LogNorm(vmin=vmin, vmax=vmax)
    if scale == "symlog":
        top = max(abs(vmin or 0.0), abs(vmax or 0.0), 1e-12)
        return colors.SymLogNorm(linthresh=linthresh or 1e-2 * top, vmin=vmin, vmax=vmax, base=10)
    if center is not None:
        return colors.TwoSlopeNorm(vcenter=center, vmin=vmin, vmax=vmax)
    return colors.Normalize(vmin=vmin, vmax=vmax)


def _scalar_coords_title(da: xr.DataArray) -> str:
    # Same idea as xarray's automatic titles: scalar coordinates (checkpoint, n_streams, ...) identify the slice.
    return ", ".join(f"{k} = {v.values.item()}" for k, v in da.coords.items() if v.ndim == 0)


def _new_axes(figsize: tuple[float, float]) -> Axes:
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)[1]


def heatmap(
    da: xr.DataArray,
    ax: Axes | None = None,
    *,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    center: float | None = None,
    title: str | None = None,
    mask_nan: bool = True,
    annot: bool = False,
    scale: str = "linear",
    linthresh: float | None = None,
    extend: str = "neither",
) -> Axes:
    """Draw a 2-D DataArray (rows = dims[0], columns = dims[1]) as a heatmap; returns the Axes.

    Uses seaborn when both sides are ≤ 16 (annotations off by default) and `imshow` beyond. NaN cells
    (e.g. the invalid ℓ+n > L triangle) are left blank when mask_nan. `center` gives a diverging scale
    symmetric about it (use with cmap="vlag" for signed Δ scores). scale: linear | log | symlog (values over
    orders of magnitude; `linthresh` for symlog, see `color_norm`); non-linear scales draw with imshow.
    extend: the colour bar's arrows for values outside [vmin, vmax] (neither | min | max | both).
    """
    if da.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D DataArray, got dims {da.dims}")
    ax = ax if ax is not None else _new_axes((6.4, 5.2))
    values = np.asarray(da.values, dtype=np.float64)
    if center is not None and (vmin is None or vmax is None):
        radius = float(np.nanmax(np.abs(values - center))) if np.isfinite(values).any() else 1.0
        vmin = center - radius if vmin is None else vmin
        vmax = center + radius if vmax is None else vmax
    row_dim, col_dim = da.dims
    cbar_label = _label(da)
    if scale not in ("linear", "log", "symlog"):
        raise ValueError(f"scale must be linear, log or symlog, got {scale!r}")
    import seaborn as sns  # also registers its colour maps (vlag) for the imshow path

    if max(da.shape) <= SEABORN_MAX_SIZE and scale == "linear":
        df = da.astype(np.float64).to_pandas()
        sns.heatmap(
            df,
            ax=ax,
            vmin=vmin,
            vmax=vmax,
            cmap=cmap,
            center=center,
            square=True,
            annot=annot,
            fmt=".2f",
            mask=np.isnan(values) if mask_nan else None,
            cbar_kws={"label": cbar_label, "extend": extend},
        )
        ax.tick_params(axis="y", labelrotation=0)  # seaborn turns row labels sideways
    else:
        shown = np.ma.masked_invalid(values) if mask_nan else values
        if scale == "log":
            shown = np.ma.masked_less_equal(shown, 0.0)  # log |v|: zero and below have no colour (blank)
        im = ax.imshow(
            shown, cmap=cmap, norm=color_norm(scale, vmin, vmax, linthresh), aspect="equal", interpolation="nearest"
        )
        ax.figure.colorbar(
            im, ax=ax, label=cbar_label + ("" if scale == "linear" else f" ({scale} scale)"), extend=extend
        )
        _index_ticks(ax, da)
    ax.set_ylabel(axis_label(da, row_dim))
    ax.set_xlabel(axis_label(da, col_dim))
    ax.set_title(title if title is not None else _scalar_coords_title(da))
    return ax


def _index_ticks(ax: Axes, da: xr.DataArray, max_ticks: int = 17) -> None:
    """Coordinate-valued ticks for imshow, thinned to at most ~max_ticks per axis."""
    for axis, dim, setter, labeller in (
        (0, da.dims[0], ax.set_yticks, ax.set_yticklabels),
        (1, da.dims[1], ax.set_xticks, ax.set_xticklabels),
    ):
        n = da.shape[axis]
        positions = np.arange(0, n, max(1, math.ceil(n / max_ticks)))
        labels = da[dim].values[positions] if dim in da.coords else positions
        setter(positions)
        labeller([str(v) for v in labels])


def _curves_from(
    ds_or_dict: xr.DataArray | xr.Dataset | Mapping[Any, xr.DataArray],
    theta_dim: str,
    var: str | None,
    checkpoint_dim: str,
) -> dict[str, xr.DataArray]:
    """Normalise the `share_curves` input to {label: 1-D DataArray along theta_dim}."""
    if isinstance(ds_or_dict, Mapping) and not isinstance(ds_or_dict, xr.Dataset):
        return {str(k): v for k, v in ds_or_dict.items()}
    da = ds_or_dict
    if isinstance(da, xr.Dataset):
        candidates = [var] if var is not None else [n for n, v in da.data_vars.items() if theta_dim in v.dims]
        if len(candidates) != 1:
            raise ValueError(f"pick one share variable with var=; candidates along {theta_dim!r}: {candidates}")
        da = da[candidates[0]]
    if da.ndim == 1:
        return {str(da.name or "share"): da}
    if checkpoint_dim not in da.dims or da.ndim != 2:
        raise ValueError(f"expected dims ({checkpoint_dim!r}, {theta_dim!r}), got {da.dims}")
    return {str(c.values.item()): da.sel({checkpoint_dim: c}) for c in da[checkpoint_dim]}


def share_curves(
    ds_or_dict: xr.DataArray | xr.Dataset | Mapping[Any, xr.DataArray],
    theta_dim: str = "threshold",
    headline: float | None = None,
    ax: Axes | None = None,
    *,
    var: str | None = None,
    checkpoint_dim: str = "checkpoint",
    logx: bool = False,
) -> Axes:
    """Plot the complementary-CDF curves S(θ), one per checkpoint, with the headline θ as a vertical line.

    ds_or_dict: a DataArray [checkpoint, threshold] or [threshold], a Dataset (with `var` or a single
    variable along theta_dim), or {name: 1-D DataArray along theta_dim}. headline defaults to the
    `headline_threshold` attr when present. Returns the Axes.
    """
    curves = _curves_from(ds_or_dict, theta_dim, var, checkpoint_dim)
    ax = ax if ax is not None else _new_axes((6.4, 4.2))
    first = next(iter(curves.values()))
    for name, da in curves.items():
        ax.plot(da[theta_dim].values, np.asarray(da.values, dtype=np.float64), marker=".", label=name)
    if headline is None:
        headline = first.attrs.get("headline_threshold")
    if headline is not None:
        ax.axvline(float(headline), color="0.35", linestyle="--", linewidth=1, label=f"headline θ = {headline:g}")
    if logx:
        ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(_label(first[theta_dim], fallback=theta_dim))
    ax.set_ylabel(first.attrs.get("long_name", "share of late pairs above θ"))
    ax.legend(frameon=False, fontsize="small")
    return ax


# Byte-identical files run to run: the creator tag (which lets `--overwrite` recognise a file as ours,
# depthlens.io.atomic.recognise) and no date or library version in the metadata; fixed SVG ids; text as paths
# in SVG so the file does not depend on the viewer's fonts.
FIGURE_METADATA = {
    "png": {"Software": "depthlens"},
    "pdf": {"Creator": "depthlens", "Producer": None, "CreationDate": None},
    "svg": {"Creator": "depthlens", "Date": None},
}
REPRODUCIBLE_RC: dict[RcKeyType, Any] = {"svg.hashsalt": "depthlens", "svg.fonttype": "path", "pdf.fonttype": 42}


def save_figure(fig: Figure | Axes, path: str | os.PathLike[str], dpi: int = 120) -> Path:
    """Save a Figure (or an Axes' figure) atomically — temp file in the same directory, then rename — and close it.

    The format follows the path suffix (.png, .pdf, .svg). Unwritable targets raise DepthlensError.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    fig = cast("Figure", getattr(fig, "figure", fig))  # accept an Axes too (its figure)
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    from depthlens.io.atomic import atomic_target

    try:
        with atomic_target(path) as tmp, matplotlib.rc_context(REPRODUCIBLE_RC):
            fig.savefig(tmp, dpi=dpi, format=fmt, bbox_inches="tight", metadata=FIGURE_METADATA.get(fmt))
    finally:
        plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------
# terminal


_SHADES = " ░▒▓█"
# viridis sampled at 8 points: colour carries the value, the shade character keeps it readable without colour.
_VIRIDIS = ("#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725")
_CELL = 2  # characters per cell: square-ish in a terminal and 64 columns for L = 32


def terminal_heatmap(
    matrix: Any,
    row_labels: Sequence[object] | None = None,
    col_labels: Sequence[object] | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
    legend: bool = False,
) -> Text:
    """A compact coloured heatmap as `rich.text.Text`: one header line of column labels + one line per row
    (+ with `legend`, one line saying what each glyph means).

    Each cell is two characters, shaded (" ░▒▓█") and coloured (viridis) by its value clipped to
    [vmin, vmax]; NaN cells show a dim "·". Column labels are thinned so they never overlap.
    Use `.plain` for an uncoloured string.
    """
    from rich.text import Text

    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"terminal_heatmap needs a 2-D matrix, got shape {m.shape}")
    n_rows, n_cols = m.shape
    rows = [str(r) for r in (row_labels if row_labels is not None else range(n_rows))]
    cols = [str(c) for c in (col_labels if col_labels is not None else range(n_cols))]
    if len(rows) != n_rows or len(cols) != n_cols:
        raise ValueError(f"need {n_rows} row and {n_cols} column labels, got {len(rows)} and {len(cols)}")
    if not vmax > vmin:
        raise ValueError(f"need vmax > vmin, got vmin={vmin}, vmax={vmax}")
    pad = max(len(r) for r in rows) if rows else 0
    out = Text(no_wrap=True)
    out.append(" " * (pad + 1) + _header(cols) + "\n", style="bold")
    frac = np.clip((m - vmin) / (vmax - vmin), 0.0, 1.0)
    for i, label in enumerate(rows):
        out.append(label.rjust(pad) + " ")
        for f in frac[i]:
            if np.isnan(f):
                out.append("·".center(_CELL), style="dim")
            else:
                shade = _SHADES[min(int(f * len(_SHADES)), len(_SHADES) - 1)]
                out.append(shade * _CELL, style=_VIRIDIS[min(int(f * len(_VIRIDIS)), len(_VIRIDIS) - 1)])
        if i < n_rows - 1:
            out.append("\n")
    if legend:
        out.append("\n" + glyph_legend(vmin, vmax), style="dim")
    return out


def glyph_legend(vmin: float, vmax: float) -> str:
    """What each glyph of `terminal_heatmap` means, each from the value before it: 'glyphs from 0: [  ] 0.2 [░░]
    0.4 [▒▒] 0.6 [▓▓] 0.8 [██] up to 1 and above; · no value'."""
    k = len(_SHADES)
    edges = [vmin + (vmax - vmin) * i / k for i in range(1, k)]
    parts = [f"[{_SHADES[0] * _CELL}]", *(f"{e:.3g} [{g * _CELL}]" for e, g in zip(edges, _SHADES[1:], strict=True))]
    return f"glyphs from {vmin:.3g}: {' '.join(parts)} up to {vmax:.3g} and above; · no value"


def _header(cols: list[str]) -> str:
    """Column labels left-aligned at their cell, every `stride`-th one so labels keep a space between them."""
    width = max((len(c) for c in cols), default=1)
    stride = math.ceil((width + 1) / _CELL)
    line = [" "] * (len(cols) * _CELL + width)
    for k in range(0, len(cols), stride):
        line[k * _CELL : k * _CELL + len(cols[k])] = cols[k]
    return "".join(line).rstrip()

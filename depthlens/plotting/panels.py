"""What every depthlens figure shares: design colours and names, the panel grid, a checkpoint's heading, value
spans and colour-scale rules. A layer below the diagnostics (with `plotting.plots`), so each diagnostic's own
figure (`diagnostics/<name>/figure.py`) and the cross-checkpoint report figures (`render/figures.py`) draw alike.

Every figure has a title, labelled axes (heatmaps: from the coordinates' `long_name`) and, for heatmaps, a colour
bar labelled `long_name [units]` spanning the data: a log (or symmetric-log) scale where values span orders of
magnitude, blank (masked) cells where a value is undefined. Nothing calls `plt.show()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from depthlens.designs import DESIGNS, SLUGS

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from numpy.typing import ArrayLike

# studies.study.Entry and studies.report.Report: plotting sits below studies (tests/test_architecture.py), so
# they are named here for the signatures, not imported
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


def finite(a: ArrayLike) -> bool:
    return bool(np.isfinite(np.asarray(a, dtype=float)).any())


def span(values: ArrayLike, floor: float = 1e-6) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    return (lo, hi) if hi - lo > floor else (lo - 0.5 * max(abs(lo), 1.0) * 1e-3 - floor, hi + floor)


def subplots(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.4, 5.2), **kw: Any) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kw)


def heading(e: Entry) -> str:
    return f"{e.name} — {design_name(e.slug)}, L = {e.n_layer}, d = {e.d_model}"


def causal_scale(top: float) -> dict[str, Any]:
    """Colour scale of C: linear [0, max(1, top)] up to CAUSAL_VMAX; beyond, one outlier (C ≫ 1) would wash out
    the rest, so log [LOG_FLOOR, top] (smaller C take the lowest colour)."""
    if top > CAUSAL_VMAX:
        return {"vmin": LOG_FLOOR, "vmax": top, "scale": "log", "extend": "min"}
    return {"vmin": 0.0, "vmax": max(1.0, top), "scale": "linear", "extend": "neither"}


def legend_right(fig: Figure, handles: dict[str, Any]) -> None:
    """One legend for the whole figure, outside on the right ({label: artist}; nothing when empty)."""
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles.keys()),
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            frameon=False,
            fontsize="small",
        )

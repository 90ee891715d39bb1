"""Plots render to real PNGs; the terminal heatmap has the expected layout."""

import numpy as np
import pytest
import xarray as xr

from depthlens.plotting import plots as P


@pytest.fixture(autouse=True)
def agg_backend():
    import matplotlib

    matplotlib.use("Agg")  # headless; the library itself never selects a backend


def _matrix(n, seed=0):
    A = np.random.default_rng(seed).random((n, n))
    A[np.tril_indices(n)] = np.nan  # masked triangle
    return xr.DataArray(
        A,
        dims=("layer", "layer_other"),
        coords={"layer": np.arange(n), "layer_other": np.arange(n), "checkpoint": "hc"},
        name="causal_score",
        attrs={"long_name": "causal score", "units": "1"},
    )


@pytest.mark.parametrize("n", [8, 32])  # seaborn path and imshow path
def test_heatmap_renders_png(tmp_path, n):
    import matplotlib.pyplot as plt

    ax = P.heatmap(_matrix(n), vmin=0, vmax=1)
    fig = ax.figure
    assert ax.get_ylabel() == "layer" and ax.get_xlabel() == "layer_other"
    assert fig.axes[-1].get_ylabel() == "causal score [1]"  # colour bar
    assert ax.get_title() == "checkpoint = hc"
    path = P.save_figure(fig, tmp_path / f"heat{n}.png")
    assert path.stat().st_size > 5_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)
    assert [p.name for p in tmp_path.iterdir()] == [f"heat{n}.png"]


def test_heatmap_diverging_center_and_guards():
    da = _matrix(6) - 0.5
    ax = P.heatmap(da, center=0.0, cmap="vlag", title="Δ")
    assert ax.get_title() == "Δ"
    with pytest.raises(ValueError):
        P.heatmap(da.isel(layer=0))


def test_share_curves_renders_with_headline(tmp_path):
    thetas = np.linspace(0, 1.5, 31)
    curves = np.stack([np.exp(-4 * thetas), np.exp(-2 * thetas)])
    da = xr.DataArray(
        curves,
        dims=("checkpoint", "threshold"),
        coords={"checkpoint": ["preln_l8", "hc_l8"], "threshold": thetas},
        name="share",
        attrs={"long_name": "share of late pairs with C > θ", "units": "1"},
    )
    ax = P.share_curves(da.to_dataset(), headline=0.45)
    vertical = [ln for ln in ax.lines if np.allclose(ln.get_xdata(), 0.45)]
    assert len(vertical) == 1
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["preln_l8", "hc_l8"]
    assert ax.get_xlabel() == "threshold"
    path = P.save_figure(ax, tmp_path / "shares.png")
    assert path.stat().st_size > 5_000
    # dict input, log axis
    ax2 = P.share_curves({"a": da.isel(checkpoint=0)}, headline=0.45, logx=True)
    assert ax2.get_xscale() == "log"
    P.save_figure(ax2, tmp_path / "a.png")


def test_terminal_heatmap_rows_and_nan():
    m = np.random.default_rng(1).random((5, 12))
    m[2, 3] = np.nan
    text = P.terminal_heatmap(m, [f"L{i}" for i in range(5)], list(range(12)))
    lines = text.plain.split("\n")
    assert len(lines) == 1 + 5
    assert all(len(line) == 3 + 2 * 12 for line in lines[1:])
    assert "·" in lines[3] and lines[1].startswith("L0 ")
    assert "10" in lines[0]
    with pytest.raises(ValueError):
        P.terminal_heatmap(m, ["a"], list(range(12)))

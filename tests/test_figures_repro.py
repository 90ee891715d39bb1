"""Readable, reproducible figures: undefined cells blank, log/symlog scales where values span orders of magnitude,
axis names from the coordinates' long_name, colour bars over the data's range; every report file but timings.json
byte-identical run to run, figures without dates or versions in their metadata."""

from __future__ import annotations

import filecmp
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import depthlens
from depthlens.diagnostics.causal.figure import fig_causal
from depthlens.diagnostics.mixing.figure import fig_mixing
from depthlens.models import ModelConfig, build_model
from depthlens.plotting import plots
from depthlens.render import figures
from depthlens.runtime.evaldata import EvalData

torch.set_num_threads(1)
L = 8


@pytest.fixture(autouse=True)
def agg_backend():
    import matplotlib

    matplotlib.use("Agg")


def _entry(slug: str, datasets: dict) -> SimpleNamespace:
    return SimpleNamespace(name=f"{slug}_l{L}", slug=slug, n_layer=L, d_model=32, datasets=datasets, notes=[])


@pytest.fixture(scope="module")
def results():
    """Real engine datasets of an HC model (its M mixes streams: signed weights) and a Pre-LN one."""
    from depthlens.diagnostics.causal.engine import causal_scores
    from depthlens.diagnostics.mixing.engine import depth_mixing_dataset

    data = EvalData.from_tokens(np.random.default_rng(0).integers(0, 256, size=(2, 16)))
    out = {}
    for slug in ("hc", "preln"):
        m = build_model(ModelConfig.debug(slug, n_layer=L, vocab_size=257, max_seq_len=32), seed=0)
        with torch.no_grad():
            out[slug] = {
                "causal": causal_scores(m, data, variants=("current",)),
                "mixing": depth_mixing_dataset(m, data),
            }
    return out


def _image(ax) -> np.ma.MaskedArray:
    return ax.images[0].get_array() if ax.images else np.ma.masked_invalid(ax.collections[0].get_array())


def test_coordinates_name_the_axes(results):
    ds = results["preln"]["causal"]
    assert (
        ds["layer"].attrs["long_name"] == "skipped layer s"
        and ds["layer_other"].attrs["long_name"] == "measured layer t"
    )
    assert ds["causal_score"].dims[-2:] == ("layer", "layer_other")  # dim names unchanged: stored datasets compare
    fig = fig_causal(ds, _entry("preln", {}))
    ax = fig.axes[0]
    assert (ax.get_ylabel(), ax.get_xlabel()) == ("skipped layer s", "measured layer t")
    fig = fig_mixing(results["hc"]["mixing"], _entry("hc", {}))
    assert fig.axes[0].get_ylabel().startswith("source i") and fig.axes[0].get_xlabel().startswith("destination j")
    import matplotlib.pyplot as plt

    plt.close("all")


def test_undefined_lower_triangle_is_blank_not_zero(results):
    ds = results["preln"]["causal"]
    C = ds["causal_score"].sel(variant="current", aggregator="max").values
    assert np.isnan(C[np.tril_indices(L, -1)]).all()  # stored as NaN (no measurement) ...
    fig = fig_causal(ds, _entry("preln", {}))
    img = _image(fig.axes[0])
    shown = np.ma.getmaskarray(img).reshape(L, L)
    assert shown[np.tril_indices(L, -1)].all() and not shown[np.triu_indices(L)].any()  # ... drawn blank
    da = plots.upper_triangle(
        xr.DataArray(np.ones((3, 4)), dims=("a", "b"), coords={"a": [1, 2, 3], "b": [0, 1, 2, 3]})
    )
    np.testing.assert_array_equal(np.isnan(da.values), np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], bool))
    import matplotlib.pyplot as plt

    plt.close("all")


def test_scales_follow_the_data_range(results):
    from matplotlib.colors import LogNorm, SymLogNorm

    ds = results["hc"]["mixing"].copy(deep=True)
    M = ds["depth_mixing"].values
    M[0, -1] = -4000.0  # HC's trained M reaches thousands next to weights of order 1
    fig = fig_mixing(ds, _entry("hc", {}))
    im = fig.axes[0].images[0]
    assert isinstance(im.norm, SymLogNorm) and im.norm.vmin == -4000 and im.norm.vmax == 4000
    # small weights stay distinguishable from 0: a linear ±4000 scale would put 0.5 within 0.01% of the middle
    assert abs(im.norm(0.5) - im.norm(0.0)) > 0.1

    causal = results["preln"]["causal"].copy(deep=True)
    causal["causal_score"].values[..., L // 4, L - 1] = 7.5  # one C ≫ 1, inside the late window of the overview
    fig = fig_causal(causal, _entry("preln", {}))
    im = fig.axes[0].images[0]
    assert isinstance(im.norm, LogNorm) and im.norm.vmax == pytest.approx(7.5)
    entries = [_entry("preln", {"causal": causal}), _entry("hc", {"causal": results["hc"]["causal"]})]
    fig = figures.fig_overview(entries, "causal")
    panel = next(ax for ax in fig.axes if ax.images)
    assert panel.images[0].norm.vmax == pytest.approx(7.5)  # the colour bar spans the data, not [0, 1]
    assert [t.get_text() for t in panel.get_xticklabels()] == [str(L // 4), str(L - 1)]  # layer ticks
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_saved_figures_are_byte_identical_and_undated(tmp_path, fmt):
    import matplotlib

    def draw():
        ax = plots.heatmap(xr.DataArray(np.arange(9.0).reshape(3, 3), dims=("layer", "layer_other"), name="x"))
        return ax.figure

    a = plots.save_figure(draw(), tmp_path / f"a.{fmt}").read_bytes()
    b = plots.save_figure(draw(), tmp_path / f"b.{fmt}").read_bytes()
    assert a == b
    assert matplotlib.__version__.encode() not in a and b"depthlens" in a  # creator tag, no library version
    assert not re.search(rb"20\d\d-\d\d-\d\d|D:20\d{6}", a)  # no ISO (SVG) or PDF date


@pytest.mark.slow
def test_report_files_byte_identical_run_to_run(tmp_path, monkeypatch):
    """Two runs of the same small report: every file but the (git-ignored) timings.json is byte-identical."""
    from depthlens.cli import app

    m = build_model(ModelConfig.debug("hc", n_layer=4, vocab_size=257, max_seq_len=32), seed=0)
    ck = depthlens.save(m, tmp_path / "ckpts" / "hc_l4")
    text = tmp_path / "eval.txt"
    text.write_text("Reproducible reports need identical bytes for identical inputs. " * 40)
    out, first = tmp_path / "rep", tmp_path / "first"
    args = [
        "report",
        str(ck),
        "--out",
        str(out),
        "--data",
        str(text),
        "--n-seq",
        "2",
        "--seq-len",
        "16",
        "--n-boot",
        "5",
        "--metrics",
        "causal,mixing",
        "--overwrite",
        "--quiet",
    ]
    for k in range(2):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.stderr
        if k == 0:
            shutil.copytree(out, first)
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert any(f.suffix == ".nc" for f in files) and any(f.suffix == ".png" for f in files)
    differ = [str(f) for f in files if not filecmp.cmp(out / f, first / f, shallow=False)]
    # only the git-ignored files may differ: timings, and the ownership marker (it records when and by which command)
    assert set(differ) <= {"timings.json", ".depthlens-output"}, differ


def test_reproducible_strips_run_stamps(tmp_path, monkeypatch):
    from depthlens.studies.reproducible import reproducible

    monkeypatch.chdir(tmp_path)
    ds = xr.Dataset(
        {"x": (("checkpoint",), [1.0, 2.0])},
        coords={
            "checkpoint": ["a", "b"],
            "history": (
                "checkpoint",
                ["2026-12-01T16:20:55+00:00 depthlens report a b", "2026-12-01T16:20:58+00:00 depthlens report a b"],
            ),
            "created": ("checkpoint", ["2026-12-01T16:20:55+00:00", "2026-12-01T16:20:58+00:00"]),
            "checkpoint_path": ("checkpoint", [str(tmp_path / "ck" / "a"), "/elsewhere/b"]),
        },
        attrs={"created": "2026-12-01T16:20:55+00:00", "source": "depthlens"},
    )
    out = reproducible(ds)
    assert "created" not in out.coords and "created" not in out.attrs and "history" not in out.coords
    assert out.attrs["history"] == "depthlens report a b" and out.attrs["source"] == "depthlens"
    assert list(out["checkpoint_path"].values) == [str(Path("ck") / "a"), "/elsewhere/b"]
    np.testing.assert_array_equal(out["x"].values, ds["x"].values)

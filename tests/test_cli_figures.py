"""Figures from the one-checkpoint commands: `--plot FILE` on causal and permute (checked before any work, like
--out), and the glyph legend under the terminal heatmap."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.io.atomic import recognise
from depthlens.plotting.plots import glyph_legend, terminal_heatmap
from helpers import FAST, FAST_NO_BOOT


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return str(tiny_ckpt("preln"))


@pytest.mark.parametrize("cmd", ["causal", "permute"])
def test_plot_writes_a_figure_and_says_where(ckpt, tmp_path, cmd):
    png = tmp_path / f"{cmd}.png"
    r = CliRunner().invoke(
        app, [cmd, ckpt, *FAST_NO_BOOT, "--out", str(tmp_path / "x.nc"), "--plot", str(png), "--json"]
    )
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and recognise(png) == "figure"  # ours: replaceable later


@pytest.mark.parametrize(("plot", "needle"), [("x.txt", "use a .png, .pdf or .svg"), ("x.nc", "name the same file")])
def test_a_bad_plot_is_refused_before_any_work(ckpt, tmp_path, plot, needle):
    r = CliRunner().invoke(
        app, ["causal", ckpt, *FAST_NO_BOOT, "--out", str(tmp_path / "x.nc"), "--plot", str(tmp_path / plot)]
    )
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code in (1, 2) and len(lines) == 1 and needle in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no dataset written first


def test_the_heatmap_says_what_its_glyphs_mean(ckpt, tmp_path):
    r = CliRunner().invoke(app, ["causal", ckpt, *FAST_NO_BOOT, "--out", str(tmp_path / "c.nc")])
    assert r.exit_code == 0 and "glyphs from 0: [  ] 0.2 [░░] 0.4 [▒▒] 0.6 [▓▓] 0.8 [██] up to 1" in r.stdout
    # each glyph stands for the values from the number before it, as the legend says (a value per interval)
    values = np.array([[0.1, 0.3, 0.5, 0.7, 0.9, 1.7, np.nan]])
    row = terminal_heatmap(values, vmin=0.0, vmax=1.0).plain.splitlines()[1].split(" ", 1)[1]
    assert [row[i : i + 2] for i in range(0, 14, 2)] == ["  ", "░░", "▒▒", "▓▓", "██", "██", "· "]
    assert (
        glyph_legend(0.0, 2.0)
        == "glyphs from 0: [  ] 0.4 [░░] 0.8 [▒▒] 1.2 [▓▓] 1.6 [██] up to 2 and above; · no value"
    )


def test_the_track_table_has_one_header_per_cell():
    """`depthlens track`'s terminal table: the headers come from the same place as the cells (the shipped
    reports/track/track.nc has both shares and erank, where the old fixed headers slid one column over)."""
    from pathlib import Path

    from depthlens.io.dataset import read_netcdf
    from depthlens.render.track import track_columns, track_rows

    ds = read_netcdf(Path(__file__).parents[1] / "reports" / "track" / "track.nc")
    rows = track_rows(ds)
    assert rows and all(len(r) == len(track_columns(ds, short=True)) == len(track_columns(ds)) for r in rows)
    assert track_columns(ds, short=True)[-1] == "val loss first → last" and rows[0][-1].count("→") == 1


def test_a_diagnostic_s_track_column_comes_from_its_spec():
    """A plug-in's `track_columns` entry is a column of the track table, after the shipped ones and before the val
    loss: its variable at the first and last snapshot, each value of its other dimension "/"-joined in coordinate
    order, — for a run without a finite value; the report's header lists the coordinate's values."""
    from pathlib import Path

    from depthlens.diagnostics import registry
    from depthlens.io.dataset import read_netcdf
    from depthlens.render.track import track_columns, track_rows

    ds = read_netcdf(Path(__file__).parents[1] / "reports" / "track" / "track.nc")
    values = np.arange(ds.sizes["run"] * ds.sizes["step"] * 2, dtype=float).reshape(ds.sizes["run"], -1, 2) / 8
    values[0] = np.nan  # the first run: no value at any snapshot
    ds["toy_series"] = (("run", "step", "part"), values)
    ds = ds.assign_coords(part=["in", "out"])
    column = registry.TrackColumn("toy_series", "toy", "toy series of the parts", fmt=".3f")
    before = track_columns(ds, short=True)
    with registry.register(registry.Diagnostic("toy", "m:f", "a plug-in", track_columns=(column,))):
        short, long, rows = track_columns(ds, short=True), track_columns(ds), track_rows(ds)
    assert short == [*before[:-1], "toy, first → last", before[-1]]
    assert long[-2] == "toy series of the parts (in/out), first → last"
    assert [r[-2] for r in rows[:2]] == ["—", "1.750/1.875 → 3.250/3.375"]  # run 1: steps 0 and 6 (the last)
    assert all(len(r) == len(short) for r in rows)


def test_a_wide_table_is_printed_whole_into_a_pipe(capsys):
    from rich.table import Table

    from depthlens.cli.app import print_table

    t = Table(title="wide")
    for k in range(12):
        t.add_column(f"column {k} GFLOP/tok", justify="right")
    t.add_row(*[f"{1000.5 * k:.1f}" for k in range(12)])
    print_table(t)
    lines = capsys.readouterr().out.splitlines()
    body = [ln for ln in lines if ln.startswith(("┏", "┃", "┡", "│", "└"))]
    assert body and all(ln.endswith(("┓", "┃", "┩", "│", "┘")) for ln in body), lines  # no column cut off
    assert "11005.5" in lines[-2]  # the last cell, whole


def test_the_overview_has_no_dead_space_and_no_overlapping_labels():
    """The report's overview grid: the title sits right above the panels (it floated an inch above them), and the
    headline θ is named in the colour bar's label, not in a text that overlapped the panels next to the bar."""
    import types
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from depthlens.io.dataset import read_netcdf
    from depthlens.render import figures

    entries = []
    for L in (4, 8):
        ds = read_netcdf(Path(__file__).parents[1] / "reports" / "zoo" / f"causal_l{L}.nc")
        for name in [str(n) for n in ds["checkpoint"].values if str(n).startswith(("preln_", "hc_"))]:
            entries.append(
                types.SimpleNamespace(
                    slug=name.rsplit("_l", 1)[0], n_layer=L, datasets={"causal": ds.sel(checkpoint=name)}
                )
            )
    fig = figures.fig_overview(entries, "causal")
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(r)
    panels = [ax for ax in fig.axes if ax.get_images() and ax.get_title()]  # the top row (titled by design)
    top = max(ax.get_tightbbox(r).y1 for ax in panels)
    assert 0 <= title.y0 - top < 0.25 * fig.dpi, (title.y0, top)  # under a quarter inch between title and panels
    bar = fig.axes[-1]
    assert "θ = 0.45" in bar.get_ylabel()
    texts = [t for ax in fig.axes for t in ax.texts if t.get_text().startswith("θ")]
    assert texts == []
    boxes = [ax.get_tightbbox(r) for ax in fig.axes]
    bar_box = boxes[-1]
    assert not any(b.overlaps(bar_box) for b in boxes[:-1]), "the colour bar overlaps a panel"
    plt.close(fig)


def test_a_sweep_reruns_into_the_default_folder(ckpt, tmp_path, monkeypatch):
    """The sequential docs run found it: a sweep's dataset (curves built by concat) carried no `source`, so it was
    not recognisably ours and its re-run into depthlens-out/ was refused."""
    monkeypatch.chdir(tmp_path)
    args = ["sweep", ckpt, *FAST, "--metric", "causal"]
    for _ in range(2):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.stderr
    assert recognise(tmp_path / "depthlens-out" / "sweep.causal.nc") == "netCDF dataset"

"""scripts/compare_reports.py, the check that a move of code left a report's results as they were: it must see a
change of one value, one attribute or one summary field, and must not see a different path or history."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from helpers import load_script

cmp = load_script("compare_reports")


def _report(d, value=0.25, units="1", path="checkpoints/a", share=0.5):
    d.mkdir()
    ds = xr.Dataset(
        {"score": (("layer", "layer_other"), np.array([[np.nan, value], [0.0, np.nan]]), {"units": units})},
        coords={"checkpoint_path": path},
        attrs={"history": f"written at {path}", "metric": "score"},
    )
    ds.to_netcdf(d / "score.nc")
    (d / "summary.json").write_text(json.dumps([{"path": path, "score_share": share, "n_layer": 2}]))
    return d


def test_the_same_results_under_other_paths_are_the_same(tmp_path):
    a = _report(tmp_path / "a")
    b = _report(tmp_path / "b", path="/elsewhere/checkpoints/a")
    assert cmp.report_diffs(a, b) == []
    assert cmp.main([str(a), str(b)]) == 0


def test_a_changed_value_attribute_or_field_is_named(tmp_path):
    a = _report(tmp_path / "a")
    assert cmp.report_diffs(a, _report(tmp_path / "v", value=0.2500001)) == ["score.nc: 'score' differs"]
    assert cmp.report_diffs(a, _report(tmp_path / "u", units="nat")) == ["score.nc:score: attr 'units' differs"]
    assert cmp.report_diffs(a, _report(tmp_path / "s", share=0.75)) == ["summary.json[0]/score_share: 0.5 vs 0.75"]
    (tmp_path / "v" / "extra.nc").write_bytes((a / "score.nc").read_bytes())
    assert "extra.nc: only in one" in cmp.report_diffs(a, tmp_path / "v")
    assert cmp.main([str(a), str(tmp_path / "v")]) == 1

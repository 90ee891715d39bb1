"""The small summaries the CLI prints (angular profile, skip costs) against a hand computation on planted data."""

from __future__ import annotations

import numpy as np
import xarray as xr

from depthlens.diagnostics.angular.engine import profile_summary
from depthlens.diagnostics.causal.dataset import skip_summary


def test_profile_summary_drops_undefined_entries_and_finds_the_closest_block():
    ds = xr.Dataset({"profile": ("layer", np.array([0.30, 0.12, 0.25, 0.05, np.nan]))})
    s = profile_summary(ds)
    assert s["profile"] == [0.30, 0.12, 0.25, 0.05] and s["most_prunable_block"] == 3
    assert profile_summary(xr.Dataset({"profile": ("layer", np.full(3, np.nan))}))["most_prunable_block"] is None


def test_skip_summary_reads_the_companions_or_says_none():
    dl = np.array([0.5, np.nan, 2.0, 0.1])
    o = np.array([[0.2, 0.9, 0.1, np.nan]])
    ds = xr.Dataset(
        {"skip_delta_loss": ("layer", dl), "output_effect": (("variant", "layer"), o)}, coords={"variant": ["current"]}
    )
    s = skip_summary(ds)
    assert (s["max_skip_loss"], s["max_skip_loss_layer"]) == (2.0, 2)
    assert (s["max_output_effect"], s["max_output_effect_layer"]) == (0.9, 1)
    assert np.isclose(s["mean_skip_loss"], (0.5 + 2.0 + 0.1) / 3)
    assert skip_summary(xr.Dataset({"x": ("layer", dl)})) is None

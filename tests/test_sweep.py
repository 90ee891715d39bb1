"""Threshold sweeps, crossings, ranking robustness, bootstrap and the convenience API (docs/concepts.md#thresholds)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.diagnostics.sweep import (
    bootstrap_share,
    default_thresholds,
    eval_size_curve,
    headline,
    resampled_matrix,
    robustness,
    share_curves,
)
from depthlens.io.checkpoint import save
from depthlens.models.config import ModelConfig
from depthlens.models.model import build_model
from depthlens.runtime.evaldata import random_eval_data
from depthlens.studies import api


def _matrix_ds(M: np.ndarray, name: str = "causal_score") -> xr.Dataset:
    L = M.shape[-1]
    return xr.Dataset(
        {name: (("layer", "layer_other"), M)}, coords={"layer": range(L), "layer_other": range(L)}, attrs={"n_layer": L}
    )


EVAL = (6, 16, 5)  # n_seq, seq_len, seed of the shared `data` fixture (conftest.py)


@pytest.fixture(scope="module")
def causal_ds(data):
    m = build_model(ModelConfig.debug("preln", n_layer=8), seed=0).eval()
    return causal_scores(m, data, variants=("current",), layers="late", null=False)


@pytest.fixture(scope="module")
def perm_ds(data):
    m = build_model(ModelConfig.debug("preln", n_layer=6), seed=0).eval()
    return permutation_scores(m, data, pairs="late")


def test_share_curve_monotone_and_integral_equals_mean():
    g = np.random.default_rng(0)
    M = g.gamma(2.0, 0.3, size=(12, 12))
    thetas = np.linspace(0, M.max() + 0.01, 20001)
    sc = share_curves(_matrix_ds(M), "causal", thetas, starts=("quarter",))
    S = sc.share.sel(window_start="quarter").values
    assert np.all(np.diff(S) <= 0)
    iu = [(i, j) for i in range(3, 12) for j in range(i + 1, 12)]
    mean = np.mean([M[i, j] for i, j in iu])
    assert np.trapezoid(S, thetas) == pytest.approx(mean, rel=1e-3)  # ∫_0^∞ S(θ) dθ = mean of X ≥ 0
    assert S[0] == 1.0 and S[-1] == 0.0
    # crossing points lie where the curve falls through q
    for q, theta_q in zip(sc.q.values, sc.crossing.sel(window_start="quarter").values):
        k = np.searchsorted(thetas, theta_q)
        assert S[k - 1] >= q >= S[min(k, len(S) - 1)] - 1e-12


def test_window_start_and_aggregator_variants(causal_ds):
    sc = share_curves(causal_ds, "causal")
    assert sc.share.dims == ("variant", "aggregator", "window_start", "threshold")
    assert list(sc.window_start.values) == ["zero", "quarter", "half"]
    np.testing.assert_allclose(sc.threshold.values, default_thresholds("causal"))
    # only late rows were computed: window "zero" omits the NaN early pairs and equals "quarter"
    np.testing.assert_array_equal(sc.share.sel(window_start="zero").values, sc.share.sel(window_start="quarter").values)
    mx = sc.share.sel(variant="current", aggregator="max", window_start="quarter").values
    mean = sc.share.sel(variant="current", aggregator="mean", window_start="quarter").values
    assert np.all(mx >= mean)  # the max of ratios is never below their mean
    assert sc.attrs["headline_threshold"] == 0.45


def test_ranking_robustness_constructed():
    thetas = np.linspace(0, 1, 11)
    curves = xr.DataArray(
        np.stack([0.5 * (1 - thetas), 0.8 * (1 - thetas), np.where(thetas < 0.5, 0.9, 0.1)]),
        dims=("checkpoint", "threshold"),
        coords={"checkpoint": ["a", "b", "c"], "threshold": thetas},
    )
    r = robustness(curves, ["a", "b", "c"], headline_threshold=0.2)
    # a < b everywhere except θ = 1 (all zero); b < c only while c = 0.9 > b, i.e. θ < 0.5
    expected = (0.5 * (1 - thetas) < 0.8 * (1 - thetas)) & (0.8 * (1 - thetas) < np.where(thetas < 0.5, 0.9, 0.1))
    np.testing.assert_array_equal(r.holds.values.astype(bool), expected)
    assert float(r.fraction) == pytest.approx(expected.mean())
    assert r.kendall_tau.values[2] == pytest.approx(1.0)  # the headline itself
    assert r.kendall_tau.values[8] < 0.5  # order changed: c dropped below a and b


def test_bootstrap_reproducible_and_consistent(causal_ds, perm_ds):
    N = causal_ds.sizes["sequence"]
    ones = np.ones(N)
    for agg in ("max", "mean", "pooled"):
        np.testing.assert_allclose(
            resampled_matrix(causal_ds, "causal", ones, agg)[1:],
            causal_ds.causal_score.sel(variant="current", aggregator=agg).values[1:],
            rtol=1e-6,
        )
    for metric in ("perm_abs", "perm_rel", "perm_kl"):
        np.testing.assert_allclose(
            resampled_matrix(perm_ds, metric, ones), perm_ds[metric].values, rtol=1e-9, atol=1e-12
        )
    a = bootstrap_share(causal_ds, "causal", 0.9, n_boot=200, seed=7)
    b = bootstrap_share(causal_ds, "causal", 0.9, n_boot=200, seed=7)
    c = bootstrap_share(causal_ds, "causal", 0.9, n_boot=200, seed=8)
    assert a[:2] == b[:2] and np.array_equal(a[2], b[2])
    assert not np.array_equal(a[2], c[2])
    assert a[0] <= a[1]


def test_headline_and_eval_size(causal_ds, perm_ds):
    h = headline(causal_ds, "causal", n_boot=100)
    for key in ("metric", "threshold", "share", "ci_low", "ci_high", "n_pairs", "window_start", "aggregator"):
        assert key in h
    assert h["threshold"] == 0.45 and h["n_pairs"] == 15 and h["window_start"] == 2
    assert h["ci_low"] <= h["share"] + 1e-12 or h["share"] <= h["ci_high"]
    hp = headline(perm_ds, "perm_abs", 0.001, n_boot=100)
    assert hp["n_pairs"] == 10 and hp["aggregator"] is None and "clean_loss" in hp
    assert headline(causal_ds, "causal", aggregator="p95", n_boot=100)["note"]
    curve = eval_size_curve(causal_ds, "causal", 0.9, sizes=(1, 2, 4, 6))
    assert np.all(np.diff(curve.values) >= 0)  # a max over more sequences only grows


def test_api_paths_and_compare(tmp_path, data):
    paths = []
    for k, arch in enumerate(("preln", "lns")):
        paths.append(save(build_model(ModelConfig.debug(arch, n_layer=4), seed=k), tmp_path / arch))
    ds = api.causal(paths[0], data)
    assert len(ds.attrs["checkpoint_sha256"]) == 64 and ds.attrs["design"] == "preln"
    assert ds.attrs["eval_data_sha256"] == data.sha256 and ds.attrs["n_tokens"] == data.n_tokens
    both = api.compare(api.permutation, paths, data, layers="all")
    assert both.perm_abs.dims == ("checkpoint", "layer", "layer_other")
    assert list(both.checkpoint.values) == ["preln", "lns"] and both["design"].values.tolist() == ["preln", "lns"]
    sc = share_curves(both, "perm_abs", [0.0, 0.01])
    assert sc.share.dims == ("checkpoint", "window_start", "threshold")
    skip = api.layer_skip_loss(paths[1], data)
    assert skip.attrs["metric"] == "layer_skip_loss" and skip.skip_delta_loss.shape == (4,)
    assert "causal_score" not in skip
    for fn in (api.angular, api.depth_mixing):
        assert fn(paths[0], data).attrs["checkpoint_sha256"] == ds.attrs["checkpoint_sha256"]


def test_shard_shares_recount_each_shard_independently():
    """k disjoint shards: each share equals a recount from a causal run on that shard's sequences alone."""
    import numpy as np

    from depthlens.diagnostics.causal.engine import causal_scores
    from depthlens.diagnostics.sweep import shard_shares
    from depthlens.stats.shares import share_above
    from helpers import debug_model

    model = debug_model("preln", n_layer=4)
    data = random_eval_data(97, n_seq=4, seq_len=12, seed=1, bos_id=96)
    ds = causal_scores(model, data, variants=("current",), null=False)
    got = shard_shares(ds, "causal", 0.45, k=2)
    for shard, (a, b) in enumerate([(0, 2), (2, 4)]):
        sub = type(data).from_tokens(data.tokens[a:b], bos=True)
        m = (
            causal_scores(model, sub, variants=("current",), null=False)["causal_score"]
            .sel(variant="current", aggregator="max")
            .values
        )
        assert float(got[shard]) == share_above(m, 0.45, 1)
    assert got.attrs["sd"] == np.std(got.values, ddof=1)

"""Shares, sweeps, crossings, ranking robustness and the bootstrap against hand-made inputs."""

import numpy as np
import pytest

from depthlens.stats import shares as S


def test_share_is_strict_and_reads_upper_triangle_of_late_block():
    L = 8  # late window 2..7, 15 pairs
    X = np.zeros((L, L))
    X[0, :] = 9.0  # row 0 is outside the window
    X[5, 2] = X[7, 3] = 9.0  # lower triangle (j < i) is never read
    X[2, 3] = X[2, 4] = X[6, 7] = 0.45  # exactly θ: not counted (strict >)
    X[3, 5] = X[4, 7] = 0.46
    assert S.share_above(X, 0.45) == pytest.approx(2 / 15)
    assert S.share_above(X, 0.449) == pytest.approx(5 / 15)
    assert S.share_above(X, 0.45, start=0) == pytest.approx((2 + 7) / 28)  # row 0 now counts: (0,1)..(0,7)


@pytest.mark.parametrize(("L", "n_pairs"), [(8, 15), (16, 66), (32, 276)])
def test_pair_counts(L, n_pairs):
    assert S.late_values(np.zeros((L, L))).size == n_pairs
    # one late pair above θ gives exactly 1/|P|
    X = np.zeros((L, L))
    X[L - 2, L - 1] = 1.0
    assert S.share_above(X, 0.5) == pytest.approx(1 / n_pairs)


def test_nan_policy():
    X = np.zeros((8, 8))
    X[3, 4] = np.nan
    X[2, 3] = 1.0
    with pytest.raises(ValueError, match="NaN"):
        S.share_above(X, 0.5)
    assert S.share_above(X, 0.5, nan_policy="omit") == pytest.approx(1 / 14)
    X[0, 1] = np.nan  # outside the window: irrelevant
    X[3, 4] = 0.0
    assert S.share_above(X, 0.5) == pytest.approx(1 / 15)
    with pytest.raises(ValueError):
        S.share_above(np.zeros((3, 4)), 0.5)


def test_curve_non_increasing():
    rng = np.random.default_rng(0)
    X = rng.exponential(0.3, size=(16, 16))
    thetas = np.linspace(0, 1.5, 31)
    curve = S.share_curve(X, thetas)
    assert curve.shape == (31,)
    assert np.all(np.diff(curve) <= 0)
    assert curve[0] == pytest.approx(1.0)  # exponential samples are > 0


def test_integral_identity():
    """∫_0^∞ S(θ) dθ = mean of the late-pair values for X ≥ 0 (checked with a fine trapezoid)."""
    rng = np.random.default_rng(1)
    X = rng.exponential(0.4, size=(16, 16))
    late = X[4:, 4:][np.triu_indices(12, k=1)]  # late window 4..15 by hand
    thetas = np.linspace(0, late.max() + 0.1, 400_001)
    integral = np.trapezoid(S.share_curve(X, thetas), thetas)
    assert integral == pytest.approx(late.mean(), abs=1e-4)


def test_crossing_points_hand_curve():
    thetas = [0.0, 0.1, 0.2, 0.3, 0.4]
    curve = [1.0, 0.8, 0.4, 0.1, 0.0]
    got = S.crossing_points(thetas, curve)
    np.testing.assert_allclose(got, [0.175, 0.25, 0.3, 0.39], atol=1e-12)
    assert np.isnan(S.crossing_points([0, 1, 2], [1.0, 1.0, 0.6], qs=[0.5])[0])  # never reaches q
    assert np.isnan(S.crossing_points([0, 1], [0.3, 0.2], qs=[0.5])[0])  # crossing left of the grid
    assert S.crossing_points([0, 1], [0.5, 0.2], qs=[0.5])[0] == 0.0


def test_ranking_robustness_constructed_curves():
    a = np.full(10, 0.1)
    b = np.r_[np.full(6, 0.2), np.full(4, 0.05)]
    c = np.r_[np.full(6, 0.3), np.full(4, 0.0)]
    res = S.ranking_robustness({"preln": a, "hc": b, "attnres": c}, ["preln", "hc", "attnres"], headline_index=0)
    assert res.fraction == pytest.approx(0.6)
    assert res.holds.tolist() == [True] * 6 + [False] * 4
    np.testing.assert_allclose(res.tau, [1.0] * 6 + [-1.0] * 4)
    ties = S.ranking_robustness({"x": [0.1, 0.0], "y": [0.2, 0.0]}, ["x", "y"], headline_index=0)
    assert ties.fraction == 0.5 and np.isnan(ties.tau[1])  # all tied at θ_1: no strict order, τ undefined
    assert S.ranking_robustness({"x": a, "y": a}, ["x", "y"]).tau is None
    with pytest.raises(ValueError):
        S.ranking_robustness({"x": a}, ["x", "z"])


def test_bootstrap_ci_covers_truth_and_is_reproducible():
    rng = np.random.default_rng(2)
    mu, n = 1.5, 400
    x = rng.normal(mu, 1.0, size=n)
    low, high, samples = S.bootstrap_ci(lambda idx: x[idx].mean(), n, n_boot=500, seed=3)
    assert low < mu < high
    assert high - low == pytest.approx(2 * 1.96 / np.sqrt(n), rel=0.25)  # normal-theory width
    low2, high2, samples2 = S.bootstrap_ci(lambda idx: x[idx].mean(), n, n_boot=500, seed=3)
    assert (low, high) == (low2, high2) and np.array_equal(samples, samples2)
    _, _, other = S.bootstrap_ci(lambda idx: x[idx].mean(), n, n_boot=500, seed=4)
    assert not np.array_equal(samples, other)


def test_bootstrap_recomputes_max_inside_resample():
    x = np.arange(20.0)
    low, high, samples = S.bootstrap_ci(lambda idx: x[idx].max(), 20, n_boot=300, seed=0)
    assert samples.max() <= 19 and low < 19  # resamples often miss the largest sequence
    assert high == 19


def test_paired_se():
    assert S.paired_se([1.0, 2.0, 3.0, 4.0]) == pytest.approx(np.sqrt(5 / 3) / 2)
    assert np.isnan(S.paired_se([1.0]))

"""The causal engine's ratio store (`causal._CellStore`) and the bootstrap that reads its per-sequence
summaries (`sweep.resampled_matrix`), against numpy on an explicitly replicated token set.

(Moved here from test_metrics/test_stats with the removal of metrics.RatioAggregator, a second
implementation that only the tests used.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from depthlens.diagnostics.causal.engine import AGGREGATORS, Arm, _CellStore
from depthlens.diagnostics.sweep import resampled_matrix
from depthlens.stats import metrics as M
from depthlens.stats import shares as S

L, CELL = 8, (2, 5)


def _fake_tokens(seed, n_seq=6, per_seq=(5, 40), d=4):
    """Sequences of different lengths: seq [tokens] = sequence index, new/old [tokens, d] updates."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(*per_seq, size=n_seq)
    seq = np.repeat(np.arange(n_seq), lens)
    new, old = rng.normal(size=(seq.size, d)), rng.normal(size=(seq.size, d))
    return seq, new, old


def _reference_stats(seq, new, old, keep):
    """numpy statistics on an explicitly replicated token set; keep = list of sequence ids (with repeats)."""
    idx = np.concatenate([np.flatnonzero(seq == s) for s in keep])
    num = np.linalg.norm(new[idx] - old[idx], axis=1)
    den = np.linalg.norm(old[idx], axis=1)
    r = (num / np.maximum(den, 1e-6)).astype(np.float32).astype(np.float64)
    return {
        "max": r.max(),
        "mean": r.mean(),
        "p95": np.quantile(r, 0.95),
        "p99": np.quantile(r, 0.99),
        "pooled": np.sqrt((num**2).sum() / (den**2).sum()),
    }


def _store(seq, new, old, chunks=3) -> _CellStore:
    """Feed cell (2, 5) the way the engine does: padded (b, T) rows, measured where the sequence has tokens,
    streamed in uneven chunks of sequences."""
    N, T = int(seq.max()) + 1, int(np.bincount(seq).max())
    measure = torch.zeros(N, T, dtype=torch.bool)
    ratio, diff_sq, clean_sq = (np.zeros((N, T)) for _ in range(3))
    r = M.relative_change(torch.from_numpy(new), torch.from_numpy(old)).numpy()
    for i in range(N):
        k = np.flatnonzero(seq == i)
        measure[i, : k.size] = True
        ratio[i, : k.size] = r[k]
        diff_sq[i, : k.size] = ((new[k] - old[k]) ** 2).sum(-1)
        clean_sq[i, : k.size] = (old[k] ** 2).sum(-1)
    store = _CellStore([CELL[0]], L, N, 1, T)
    arm = Arm("current", CELL[0], 0, ~measure, measure)
    for part in np.array_split(np.arange(N), chunks):
        sl = slice(int(part[0]), int(part[-1]) + 1)
        store.add([arm], CELL[1], sl, ratio[None, sl], diff_sq[None, sl], clean_sq[sl])
    return store


def _seq_dataset(store: _CellStore, layers=(CELL[0],), n_layer=L) -> xr.Dataset:
    """The per-sequence variables exactly as causal_scores writes them (without the variant dim)."""
    per = store.per_sequence()
    keys = {"max": "seq_max", "sum": "seq_sum", "count": "seq_count", "num": "seq_sq_change", "den": "seq_sq_update"}
    return xr.Dataset(
        {
            name: (
                ("layer", "layer_other", "sequence"),
                store.to_matrix(per[k], list(layers), n_layer, lower=0.0 if k in ("max", "sum", "num") else np.nan),
            )
            for k, name in keys.items()
        }
    )


def test_cell_store_matches_numpy_and_streams():
    seq, new, old = _fake_tokens(0)
    store = _store(seq, new, old)
    expected = _reference_stats(seq, new, old, np.unique(seq))
    agg = store.aggregate()
    c = store.index[CELL]
    for k in AGGREGATORS:  # p95/p99: numpy 'linear' quantiles over the pooled tokens
        assert agg[k][c] == pytest.approx(expected[k], rel=1e-5), k
    assert int(store.per_sequence()["count"][c].sum()) == seq.size
    mat = store.to_matrix(agg["max"], [CELL[0]], L)
    assert mat[CELL] == pytest.approx(expected["max"], rel=1e-6)
    assert (mat[2, :2] == 0).all() and np.isnan(mat).sum() == L * L - 3  # t < s is 0; unfed cells NaN


def test_bootstrap_counts_equal_explicit_resample():
    """resampled_matrix with bootstrap multiplicities = the statistics of the replicated token set."""
    seq, new, old = _fake_tokens(1)
    ds = _seq_dataset(_store(seq, new, old))
    ids = np.unique(seq)
    rng = np.random.default_rng(7)
    for _ in range(5):
        draw = rng.integers(0, ids.size, ids.size)
        expected = _reference_stats(seq, new, old, ids[draw])
        counts = np.bincount(draw, minlength=ids.size)
        for k in ("max", "mean", "pooled"):
            got = resampled_matrix(ds, "causal", counts, aggregator=k)[CELL]
            assert got == pytest.approx(expected[k], rel=1e-5), k
        assert np.isnan(resampled_matrix(ds, "causal", counts, aggregator="p95")[CELL])  # not decomposable


def test_pooled_ratio_of_sums():
    """pooled = sqrt(Σ‖Δ‖² / Σ‖u‖²) over the cell's tokens: 8 / 2 → 2."""
    store = _CellStore([0], 2, 1, 1, 2)
    measure = torch.ones(1, 2, dtype=torch.bool)
    store.add(
        [Arm("current", 0, 0, ~measure, measure)],
        1,
        slice(0, 1),
        np.array([[[1.0, 3.0]]]),
        np.array([[[4.0, 4.0]]]),
        np.array([[1.0, 1.0]]),
    )
    assert store.aggregate()["pooled"][store.index[(0, 1)]] == pytest.approx(2.0)


def test_bootstrap_array_statistic_on_the_engine_summaries():
    """bootstrap_ci with a matrix-valued statistic: the resampled max never exceeds the full-data max."""
    rng = np.random.default_rng(5)
    N, T = 8, 30
    measure = torch.ones(N, T, dtype=torch.bool)
    store = _CellStore([0, 1], 3, N, 1, T)
    for s, t in [(0, 1), (0, 2), (1, 2)]:
        r = rng.exponential(0.2, size=(1, N, T))
        store.add([Arm("current", s, 0, ~measure, measure)], t, slice(0, N), r, r**2, np.ones((N, T)))
    ds = _seq_dataset(store, [0, 1], 3)

    def stat(idx):
        return resampled_matrix(ds, "causal", np.bincount(idx, minlength=N))

    low, high, samples = S.bootstrap_ci(stat, N, n_boot=50, seed=0)
    full = resampled_matrix(ds, "causal", np.ones(N))
    assert samples.shape == (50, 3, 3) and low.shape == (3, 3)
    cells = np.triu(np.ones((3, 3), bool), 1) & ~np.isnan(full)
    assert cells.sum() == 3
    assert np.all(high[cells] <= full[cells]) and np.all(low[cells] <= high[cells])

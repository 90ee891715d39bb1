"""Permutation score P(i, j) (docs/concepts.md#permutation-score)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.diagnostics.causal.engine import token_nll
from depthlens.diagnostics.permutation.engine import permutation_scores, swapped_order
from depthlens.errors import DepthlensError
from depthlens.runtime.evaldata import EvalData
from helpers import debug_model
from test_causal import LinearLM


def _model(arch: str = "preln", n_layer: int = 5, seed: int = 0):
    return debug_model(arch, n_layer=n_layer, seed=seed)


EVAL = (3, 16, 3)  # n_seq, seq_len, seed of the shared `data` fixture (conftest.py)


@pytest.fixture(scope="module")
def preln():
    return _model("preln", 5)


@pytest.fixture(scope="module")
def ds(preln, data):
    return permutation_scores(preln, data, pairs="all", batch_size=4, seq_batch=1)  # 4 swaps batched per call


def _full_run_delta(model, tokens, order):
    """ΔL and KL from two full forwards (no prefix reuse)."""
    with torch.no_grad():
        l0, l1 = model(tokens), model(tokens, order=order)
    nll0, nll1 = token_nll(l0, tokens), token_nll(l1, tokens)
    p0 = torch.log_softmax(l0[:, 1:-1].float(), -1)
    kl = (p0.exp() * (p0 - torch.log_softmax(l1[:, 1:-1].float(), -1))).sum(-1)
    return float((nll1 - nll0).mean()), float(kl.mean()), (nll1 - nll0).mean(-1).numpy()


def test_prefix_cached_equals_full_run(preln, data, ds):
    for i, j in [(0, 4), (1, 2), (2, 4), (3, 4)]:
        d, kl, per_seq = _full_run_delta(preln, data.tokens, swapped_order(5, i, j))
        assert ds.perm_abs.values[i, j] == pytest.approx(d, abs=2e-6)
        assert ds.perm_kl.values[i, j] == pytest.approx(kl, abs=2e-6)
        np.testing.assert_allclose(ds.delta_loss_seq.values[i, j], per_seq, atol=2e-6)
    with torch.no_grad():
        base = float(token_nll(preln(data.tokens), data.tokens).mean())
    np.testing.assert_allclose(ds.perm_rel.values, ds.perm_abs.values / base, rtol=1e-5)


def test_trunk_walked_again_when_the_state_cache_is_too_big(preln, data, ds, monkeypatch):
    """Without room for the per-i clean states the trunk is walked a second time: the same numbers."""
    import depthlens.diagnostics.permutation.engine as perm

    monkeypatch.setattr(perm, "TRUNK_CACHE_BYTES", 0)
    again = permutation_scores(preln, data, pairs="all", batch_size=4, seq_batch=1)
    for v in ("perm_abs", "perm_kl", "delta_loss_seq"):
        np.testing.assert_array_equal(again[v].values, ds[v].values)


def test_symmetric_zero_diagonal_and_both_ways(preln, data, ds):
    for var in ("perm_abs", "perm_rel", "perm_kl"):
        m = ds[var].values
        np.testing.assert_array_equal(m, m.T)
        assert np.all(np.diag(m) == 0)
    # the pair given as (j, i) is the same swap; and a full forward with the order built the other way round
    other = permutation_scores(preln, data, pairs=[(3, 1), (2, 2)])
    assert other.perm_abs.values[1, 3] == other.perm_abs.values[3, 1]
    assert other.perm_abs.values[1, 3] == pytest.approx(ds.perm_abs.values[1, 3], abs=1e-7)
    order = list(range(5))
    order[3], order[1] = 1, 3
    assert _full_run_delta(preln, data.tokens, order)[0] == pytest.approx(ds.perm_abs.values[3, 1], abs=2e-6)
    assert np.all(ds.perm_kl.values >= 0)


def test_identical_weights_give_zero(data):
    m = _model("preln", 5)
    with torch.no_grad():
        m.blocks[3].load_state_dict(m.blocks[1].state_dict())
    d = permutation_scores(m, data, pairs=[(1, 3), (1, 2)])
    assert d.perm_abs.values[1, 3] == 0 and d.perm_kl.values[1, 3] == 0
    assert d.perm_abs.values[1, 2] != 0


def test_zero_output_blocks_give_zero(data):
    m = _model("preln", 5)
    with torch.no_grad():
        for l in (1, 4):
            m.blocks[l].attn.fn.o_proj.weight.zero_()
            m.blocks[l].mlp.fn.down_proj.weight.zero_()
    d = permutation_scores(m, data, pairs=[(1, 4)])
    assert d.perm_abs.values[1, 4] == 0 and d.perm_kl.values[1, 4] == 0


def test_commuting_linear_blocks():
    toks = EvalData.from_tokens(torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(0)))
    g = torch.Generator().manual_seed(1)
    diag = torch.stack([torch.diag(0.5 * torch.randn(6, generator=g, dtype=torch.float64)) for _ in range(4)])
    d = permutation_scores(LinearLM(diag), toks, pairs="all")
    assert np.nanmax(np.abs(d.perm_abs.values)) < 1e-9 and np.nanmax(np.abs(d.perm_kl.values)) < 1e-9
    full = 0.5 * torch.randn(4, 6, 6, generator=g, dtype=torch.float64)
    d = permutation_scores(LinearLM(full), toks, pairs="all")
    off = ~np.eye(4, dtype=bool)
    assert np.all(np.abs(d.perm_abs.values[off]) > 1e-4) and np.all(d.perm_kl.values[off] > 1e-6)


def test_preln_body_equals_all(preln, data, ds):
    d = permutation_scores(preln, data, pairs="all", swap="all")
    np.testing.assert_array_equal(d.perm_abs.values, ds.perm_abs.values)
    assert d.attrs["swap"] == "all"


def test_batching_and_per_sequence(preln, data, ds):
    d = permutation_scores(preln, data, pairs="late", batch_size=1)
    late = [(i, j) for i in range(1, 5) for j in range(i + 1, 5)]
    for i, j in late:
        assert d.perm_abs.values[i, j] == pytest.approx(ds.perm_abs.values[i, j], abs=1e-6)
    assert np.isnan(d.perm_abs.values[0, 1])  # not a late pair: not computed
    assert d.delta_loss_seq.dims == ("layer", "layer_other", "sequence")
    se = d.perm_abs_se.values[1, 2]
    assert se == pytest.approx(np.std(d.delta_loss_seq.values[1, 2], ddof=1) / np.sqrt(3))


def test_errors(preln, data):
    with pytest.raises(DepthlensError, match="swap"):
        permutation_scores(preln, data, swap="router")
    with pytest.raises(DepthlensError, match="out of range"):
        permutation_scores(preln, data, pairs=[(0, 9)])
    with pytest.raises(DepthlensError, match="pairs"):
        permutation_scores(preln, data, pairs="early")


@pytest.mark.parametrize("arch", SLUGS)
def test_all_designs(arch, data):
    m = _model(arch, 3)
    body = permutation_scores(m, data, pairs="all", swap="body")
    every = permutation_scores(m, data, pairs="all", swap="all")
    for d in (body, every):
        assert np.all(np.isfinite(d.perm_abs.values)) and np.all(d.perm_kl.values >= -1e-7)
    d, kl, _ = _full_run_delta(m, data.tokens, swapped_order(3, 0, 2))
    assert body.perm_abs.values[0, 2] == pytest.approx(d, abs=5e-6)


def test_report_permutation_prefix_is_the_first_sequences_of_the_full_run(preln, data, ds):
    """`--perm-n-seq k` (StudyOptions.perm_n_seq): the trained permutation runs on the first k eval sequences, the
    same per-sequence numbers as the full run's first k; an untrained run takes the smaller of its two prefixes;
    other diagnostics keep every sequence."""
    from depthlens.studies.study import StudyOptions, metric_data

    opts = StudyOptions(perm_n_seq=2, untrained_perm_n_seq=1)
    assert metric_data(data, "causal", opts) is data
    assert metric_data(data, "permutation", opts).n_seq == 2
    assert metric_data(data, "permutation", opts, untrained=True).n_seq == 1
    assert metric_data(data, "permutation", StudyOptions(perm_n_seq=99)) is data
    part = permutation_scores(preln, metric_data(data, "permutation", opts), pairs="all", batch_size=4, seq_batch=1)
    np.testing.assert_allclose(part.delta_loss_seq.values, ds.delta_loss_seq.values[..., :2], atol=2e-6)
    assert StudyOptions(perm_n_seq=2).as_dict()["perm_n_seq"] == 2

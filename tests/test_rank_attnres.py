"""Effective rank of mixing products (docs/concepts.md#effective-rank), AttnRes self-weight / dead prefix, depth
mixing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.diagnostics.attnres.engine import attnres_dataset, attnres_from_record
from depthlens.diagnostics.mixing.engine import depth_mixing_dataset
from depthlens.diagnostics.rank.engine import (
    effective_rank_dataset,
    effective_rank_from_maps,
    res_maps,
    static_res_maps,
)
from depthlens.errors import DepthlensError
from helpers import debug_model


def _model(arch: str, n_layer: int = 2, **kw):
    return debug_model(arch, n_layer=n_layer, **kw, seed=0)


EVAL = (2, 12, 4)  # n_seq, seq_len, seed of the shared `data` fixture (conftest.py)


def _entropy_rank(M: np.ndarray) -> float:
    """Independent erank: numpy SVD, exp of the Shannon entropy of normalised singular values."""
    s = np.linalg.svd(M, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


# ---------------------------------------------------------------------------------------------------------------
# effective rank


def test_product_order_convention():
    """A hand-built two-sublayer record: x_2 = H_1 H_0 x_0, so the full product is H_1 @ H_0, not H_0 @ H_1."""
    g = np.random.default_rng(0)
    H0, H1 = g.random((3, 3)), np.diag([1.0, 0.2, 0.01]) @ g.random((3, 3))
    assert abs(_entropy_rank(H1 @ H0) - _entropy_rank(H0 @ H1)) > 1e-3  # the test can tell the orders apart
    B, T = 1, 3
    rec = {f"sub{j}.res_map": torch.tensor(H).expand(B, T, 3, 3).clone() for j, H in enumerate((H0, H1))}
    H = res_maps(rec, 2)
    assert H.shape == (B, T, 2, 3, 3)
    out = effective_rank_from_maps(H[:, 1:].reshape(-1, 2, 3, 3), n_layer=1, widths=[1, 2])
    assert out["erank"][0, 0] == pytest.approx(_entropy_rank(H1 @ H0), rel=1e-9)  # full, mean
    assert out["erank_window"][1, 0] == pytest.approx(_entropy_rank(H1 @ H0), rel=1e-9)  # w = 2
    w1 = (_entropy_rank(H0) + _entropy_rank(H1)) / 2
    assert out["erank_window"][0, 0] == pytest.approx(w1, rel=1e-9)
    np.testing.assert_allclose(out["erank_sublayer"], [_entropy_rank(H0), _entropy_rank(H1)], rtol=1e-9)
    P = H1 @ H0
    assert out["gain_fwd"][0, 0] == pytest.approx(np.abs(P).sum(1).max())
    assert out["gain_bwd"][0, 0] == pytest.approx(np.abs(P).sum(0).max())


def test_late_window_and_token_statistics():
    """L = 4: late product starts at sublayer 2⌊L/4⌋ = 2; statistics are over per-token eranks."""
    K, n = 8, 2
    maps = torch.eye(n, dtype=torch.float64).repeat(2, K, 1, 1)  # two tokens
    maps[0, 0] = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # token 0: rank-1 map in the early window only
    maps[1, 5] = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # token 1: anisotropic map in the late window
    out = effective_rank_from_maps(maps, n_layer=4, widths=[1])
    e_iso, e21 = _entropy_rank(np.eye(2)), _entropy_rank(np.diag([2.0, 1.0]))
    full = [1.0, e21]  # token 0: rank 1; token 1: diag(2, 1)
    late = [e_iso, e21]
    np.testing.assert_allclose(out["erank"][0, :2], [np.mean(full), np.median(full)], rtol=1e-9)
    np.testing.assert_allclose(out["erank"][1, :2], [np.mean(late), np.median(late)], rtol=1e-9)
    assert out["erank"][0, 4] == pytest.approx(max(full))


def test_static_maps_and_missing_readouts():
    rec = {f"static.sub{j}.res_map": torch.eye(3) for j in range(2)}
    st, note = static_res_maps(rec, 2)
    assert st.shape == (2, 3, 3) and note is None
    st, note = static_res_maps({}, 2)
    assert st is None and "static part skipped" in note
    with pytest.raises(DepthlensError, match="multi-stream design"):
        res_maps({"sub0.skip_gain": 1.0}, 2)


def test_single_stream_model_raises(data):
    with pytest.raises(DepthlensError, match=r"effective rank needs a multi-stream design \(hc, mhc\)"):
        effective_rank_dataset(_model("preln"), data)


def test_hc_at_init_has_full_rank(data):
    m = _model("hc", 2)  # A_r = I at init: every product is the identity
    ds = effective_rank_dataset(m, data)
    n = int(ds["n_streams"])
    np.testing.assert_allclose(ds.erank.sel(statistic="mean").values, n, rtol=1e-9)
    np.testing.assert_allclose(ds.erank_static.values, n, rtol=1e-9)
    np.testing.assert_allclose(ds.gain_fwd.sel(statistic="max").values, 1.0, rtol=1e-9)


def test_mhc_products_are_doubly_stochastic(data):
    ds = effective_rank_dataset(_model("mhc", 2), data)
    np.testing.assert_allclose(ds.gain_fwd.sel(statistic="max").values, 1.0, atol=1e-3)
    np.testing.assert_allclose(ds.gain_bwd.sel(statistic="max").values, 1.0, atol=1e-3)
    assert np.all(ds.erank.values >= 1 - 1e-9)


# ---------------------------------------------------------------------------------------------------------------
# AttnRes


def _record(self_weights: list[float], n_layer: int) -> dict:
    """Block-AttnRes-like readouts: sources [emb, partial], weight s on the partial, 1-s on the embedding."""
    rec = {}
    for j in range(2 * n_layer):
        s = self_weights[j // 2]
        alpha = torch.tensor([1 - s, s], dtype=torch.float64).expand(1, 4, 2).clone()  # (B, T, S)
        rec[f"sub{j}.alpha"] = alpha
        rec[f"sub{j}.source_labels"] = ["emb", "partial"]
        rec[f"sub{j}.self_weight"] = alpha[..., 1]
        rec[f"sub{j}.embedding_weight"] = alpha[..., 0]
    return rec


def test_dead_prefix_on_hand_built_profile():
    prof = [0.001, 0.03, 0.07, 0.15, 0.5, 0.9]
    r = attnres_from_record(_record(prof, 6), 6)
    np.testing.assert_allclose(r["self_weight_layer"], prof, rtol=1e-6)
    # eps grid 0.01, 0.02, 0.05, 0.1, 0.2: number of leading layers with s_l < eps
    assert r["dead_prefix"].tolist() == [1, 1, 2, 3, 4]
    np.testing.assert_allclose(r["mass_family"][:, 0] + r["mass_family"][:, 1], 1.0)
    assert r["sources"] == ["emb"]  # 'partial' is "self", never consumption
    assert r["consumption"][0] == pytest.approx(sum(2 * (1 - s) for s in prof))


def test_zero_pseudo_query_gives_uniform_weights(data):
    for arch in ("full_attnres", "block_attnres"):
        m = _model(arch, 3)
        for name, p in m.named_parameters():
            if name.endswith(".w") or "pseudo_query" in name or name.endswith("query"):
                assert torch.all(p == 0), f"{name} is not zero-initialised"
        rec = m.readouts(data.tokens)
        for j in range(6):
            a = rec[f"sub{j}.alpha"]
            np.testing.assert_allclose(a.double().numpy(), 1.0 / len(rec[f"sub{j}.source_labels"]), rtol=1e-6)
        ds = attnres_dataset(m, data)
        assert ds.self_weight.dims == ("layer",) and ds.dead_prefix.dims == ("eps",)
        assert np.isnan(ds.self_weight_sublayer.values[0])  # first sublayer: the partial is the embedding


# ---------------------------------------------------------------------------------------------------------------
# depth mixing, every design


@pytest.mark.parametrize("arch", SLUGS)
def test_depth_mixing_every_design(arch, data):
    m = _model(arch, 2)
    ds = depth_mixing_dataset(m, data)
    M = ds.depth_mixing.values
    assert M.shape == (5, 5)
    if arch == "preln":  # every source enters every later input with weight 1
        np.testing.assert_allclose(M, np.triu(np.ones((5, 5))), rtol=1e-9)
    elif np.isnan(M).all():
        assert "note" in ds.attrs
    else:
        assert np.all(np.tril(M, -1) == 0)


@pytest.mark.parametrize("size,dead_layers", [(2, 4), (1, 3)])
@torch.no_grad()
def test_dead_prefix_finds_exactly_the_blocks_that_ignore_their_own_output(data, size, dead_layers):
    """Plant a dead prefix: every token embeds to one vector e, and the routers of the first `dead_layers`
    layers query along e, so their softmax goes to the embedding source and the weight on their own
    block's partial is ~0; later routers have w = 0 (uniform, weight 1/S >= 1/9 on the partial).
    k*(eps) must return exactly `dead_layers` for every eps in the grid below 1/9."""
    L = 8
    model = _model("block_attnres", n_layer=L, attnres_block_size=size)
    assert model.config.block_starts == list(range(0, L, size))
    e = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(0))
    model.embed_tokens.weight.copy_(e.expand_as(model.embed_tokens.weight))
    routers = [m for name, m in model.named_modules() if type(m).__name__ == "AttnResRouter"]
    assert len(routers) == 2 * L
    for j, r in enumerate(routers):
        r.key_norm.weight.fill_(1.0)
        r.pseudo_query.copy_(50.0 * e / e.norm() if j < 2 * dead_layers else torch.zeros_like(e))
    ds = attnres_dataset(model, data)
    sw = ds["self_weight"].values
    assert np.nanmax(sw[:dead_layers]) < 1e-3 and np.nanmin(sw[dead_layers:]) > 1 / 9 - 1e-6
    for eps in (0.01, 0.02, 0.05, 0.1):
        assert int(ds["dead_prefix"].sel(eps=eps)) == dead_layers

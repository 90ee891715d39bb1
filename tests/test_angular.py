"""Angular distance D_n(ℓ) through the model path (docs/concepts.md#angular-distance)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.diagnostics.angular.engine import angular_distances
from depthlens.errors import DepthlensError
from depthlens.runtime.evaldata import EvalData
from helpers import debug_model


def _model(arch: str = "preln", n_layer: int = 4, seed: int = 0):
    return debug_model(arch, n_layer=n_layer, seed=seed)


EVAL = (3, 16, 2)  # n_seq, seq_len, seed of the shared `data` fixture (conftest.py)


def _arccos_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Independent reference: arccos of the cosine in float64, divided by π."""
    x, y = x.double(), y.double()
    cos = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
    return torch.arccos(cos.clamp(-1, 1)) / math.pi


def test_identity_blocks_give_zero(data):
    m = _model("preln", 4)
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.fn.o_proj.weight.zero_()
            blk.mlp.fn.down_proj.weight.zero_()
    for positions in ("last", "all"):
        D = angular_distances(m, data, positions=positions).angular_distance.values
        valid = ~np.isnan(D)
        assert valid.sum() == 5 * 6 // 2  # ℓ + n ≤ L
        assert np.all(D[valid] == 0)


def test_last_equals_all_for_one_measured_position():
    m = _model("preln", 3)
    data = EvalData.from_tokens(torch.tensor([[96, 5], [96, 17]]), bos=True)
    a = angular_distances(m, data, positions="last").angular_distance.values
    b = angular_distances(m, data, positions="all").angular_distance.values
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("positions", ["last", "all"])
def test_matches_run_with_cache_hooks(data, positions):
    m = _model("preln", 4)
    ds = angular_distances(m, data, positions=positions, batch_size=2)
    _, cache = m.run_with_cache(data.tokens)
    states = [cache[f"blocks.{l}.hook_resid_pre"] for l in range(4)] + [cache["hook_resid_final"]]
    sel = slice(-1, None) if positions == "last" else slice(1, None)
    ref = np.array([float(_arccos_distance(states[l][:, sel], states[l + 1][:, sel]).mean()) for l in range(4)])
    np.testing.assert_allclose(ds.profile.values[:4], ref, rtol=1e-4, atol=1e-6)
    assert np.isnan(ds.profile.values[4])
    # the whole matrix too: D_n(ℓ) for every offset
    D = ds.angular_distance.values
    for l in range(5):
        for n in range(5 - l):
            r = float(_arccos_distance(states[l][:, sel], states[l + n][:, sel]).mean())
            assert D[l, n] == pytest.approx(r, rel=1e-4, abs=1e-6)


def test_batching_and_input_repr(data):
    m = _model("preln", 4)
    a = angular_distances(m, data, positions="all", batch_size=1)
    b = angular_distances(m, data, positions="all", batch_size=3)
    np.testing.assert_allclose(a.angular_distance.values, b.angular_distance.values, rtol=1e-6)
    # Pre-LN: the attention input of block ℓ is h_ℓ itself
    c = angular_distances(m, data, positions="all", repr="input")
    np.testing.assert_allclose(c.angular_distance.values, a.angular_distance.values, rtol=1e-6)
    assert a.attrs["positions"] == "all" and a.attrs["n_measured_tokens"] == 3 * 15
    assert "eval_data_sha256" in a.attrs and "weights_sha256" in a.attrs


def test_errors(data):
    m = _model("preln", 2)
    with pytest.raises(DepthlensError, match="positions"):
        angular_distances(m, data, positions="first")
    with pytest.raises(DepthlensError, match="repr"):
        angular_distances(m, data, repr="sum")
    with pytest.raises(DepthlensError, match=">= 2 tokens"):
        angular_distances(m, EvalData.from_tokens(torch.tensor([[3]])))


@pytest.mark.parametrize("arch", SLUGS)
def test_all_designs(arch, data):
    m = _model(arch, 3)
    for repr in ("view", "flatten", "input"):
        ds = angular_distances(m, data, positions="all", repr=repr)
        D = ds.angular_distance.values
        valid = ~np.isnan(D)
        assert valid.sum() == 4 * 5 // 2
        assert np.all(D[:, 0][valid[:, 0]] == 0)
        assert np.all((D[valid] >= 0) & (D[valid] <= 1))

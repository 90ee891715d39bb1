"""Metrics against analytic values and independent (numpy / explicit-loop) computations."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.stats import metrics as M


def _np_angle(x, y):
    """Reference: arccos of the float64 cosine, divided by π (PruneMe's formula)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    cos = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))
    return np.arccos(np.clip(cos, -1, 1)) / np.pi


# ---------------------------------------------------------------------------------------------------------------
# angular distance


def test_angular_special_values():
    x = torch.randn(10, 32, generator=torch.Generator().manual_seed(0))
    assert torch.all(M.angular_distance(x, x) == 0)
    torch.testing.assert_close(M.angular_distance(x, -x), torch.ones(10))
    e = torch.eye(3)
    torch.testing.assert_close(M.angular_distance(e[0], e[1]), torch.tensor(0.5))
    # orthogonal in a random basis
    q, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(M.angular_distance(q[:, 0], q[:, 5]), torch.tensor(0.5, dtype=torch.float64))


def test_angular_scale_invariance_and_symmetry():
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(50, 8, generator=g), torch.randn(50, 8, generator=g)
    alpha, beta = torch.rand(50, 1, generator=g) * 100 + 1e-3, torch.rand(50, 1, generator=g) * 1e-2 + 1e-4
    d = M.angular_distance(x, y)
    torch.testing.assert_close(M.angular_distance(alpha * x, beta * y), d, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(M.angular_distance(y, x), d)


def test_angular_matches_arccos_formula_away_from_zero():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(200, 64, generator=g), torch.randn(200, 64, generator=g)
    np.testing.assert_allclose(M.angular_distance(x, y).numpy(), _np_angle(x.numpy(), y.numpy()), atol=2e-6)


def test_angular_precision_near_zero_angle():
    theta = 1e-4  # cos θ = 1 − 5e-9 rounds to 1 in float32, so arccos would give 0
    x = torch.tensor([1.0, 0.0])
    y = torch.tensor([math.cos(theta), math.sin(theta)], dtype=torch.float32)
    naive = np.arccos(np.clip(np.float32(x @ y) / np.float32(y.norm()), -1, 1)) / np.pi
    assert naive == 0.0  # the failure mode the atan2 form avoids
    d = M.angular_distance(x, y)
    assert d.dtype == torch.float32
    assert d.item() == pytest.approx(theta / math.pi, rel=1e-3)
    # float64 stays float64 and is accurate for even smaller angles
    t64 = 1e-7
    x64, y64 = x.double(), torch.tensor([math.cos(t64), math.sin(t64)], dtype=torch.float64)
    d64 = M.angular_distance(x64, y64)
    assert d64.dtype == torch.float64
    assert d64.item() == pytest.approx(t64 / math.pi, rel=1e-6)


def test_angular_low_precision_is_upcast_and_zero_is_nan():
    x = torch.randn(4, 8).to(torch.bfloat16)
    assert M.angular_distance(x, x.flip(0)).dtype == torch.float32
    assert torch.isnan(M.angular_distance(torch.zeros(3), torch.ones(3)))


def test_angular_triangle_inequality_random():
    g = torch.Generator().manual_seed(4)
    x, y, z = (torch.randn(2000, 5, dtype=torch.float64, generator=g) for _ in range(3))
    d = M.angular_distance
    assert torch.all(d(x, z) <= d(x, y) + d(y, z) + 1e-12)


_vec = st.lists(st.floats(-100, 100, allow_nan=False), min_size=3, max_size=3).filter(
    lambda v: np.linalg.norm(v) > 1e-3
)


@settings(max_examples=150, deadline=None)
@given(_vec, _vec, _vec)
def test_angular_triangle_inequality_hypothesis(a, b, c):
    x, y, z = (torch.tensor(v, dtype=torch.float64) for v in (a, b, c))
    d = M.angular_distance
    assert d(x, z) <= d(x, y) + d(y, z) + 1e-12


def test_angular_matrix_against_explicit_loops():
    L, N, d = 5, 7, 16
    states = torch.randn(L + 1, N, d, generator=torch.Generator().manual_seed(5))
    D = M.angular_distance_matrix(states)
    assert D.shape == (L + 1, L + 1) and D.dtype == torch.float64
    s = states.numpy()
    for ell in range(L + 1):
        for n in range(L + 1):
            if ell + n > L:
                assert torch.isnan(D[ell, n])
            else:
                assert D[ell, n].item() == pytest.approx(_np_angle(s[ell], s[ell + n]).mean(), abs=2e-6)


def test_angular_matrix_identity_blocks_are_zero():
    h0 = torch.randn(1, 9, 8)
    D = M.angular_distance_matrix(h0.expand(4, 9, 8))  # u_l ≡ 0: every state equals h_0
    valid = ~torch.isnan(D)
    assert valid.sum() == 10 and torch.all(D[valid] == 0)


def test_accumulator_over_batches_equals_single_shot():
    g = torch.Generator().manual_seed(6)
    states = torch.randn(4, 2, 10, 12, generator=g)  # [L+1, B, T, d]
    acc = M.AngularAccumulator(4)
    for b in range(2):
        acc.update(states[:, b, :7])
        acc.update(states[:, b, 7:])
    assert acc.count == 20
    torch.testing.assert_close(acc.result(), M.angular_distance_matrix(states), equal_nan=True)
    with pytest.raises(ValueError):
        M.AngularAccumulator(4).result()
    with pytest.raises(ValueError):
        acc.update(states[:3])


# ---------------------------------------------------------------------------------------------------------------
# causal-score ratios


def test_relative_change_hand_values():
    old = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    new = torch.tensor([[1.0, 3.0, 4.0], [3e-6, 4e-6, 0.0]])
    torch.testing.assert_close(M.relative_change(new, old), torch.tensor([5.0, 5.0]))  # 2nd: eps = 1e-6 floor
    # pooled: sqrt(25 + 25e-12) / sqrt(1)
    assert M.pooled_relative_change(new, old).item() == pytest.approx(5.0, rel=1e-9)


# ---------------------------------------------------------------------------------------------------------------
# effective rank


def _sinkhorn(x, iters=500):
    for _ in range(iters):
        x = x / x.sum(1, keepdims=True)
        x = x / x.sum(0, keepdims=True)
    return x


def _uniform_mix(n, r):
    """r I + (1 − r) J with J = 11ᵀ/n: singular values {1, r, ..., r}."""
    return r * np.eye(n) + (1 - r) * np.ones((n, n)) / n


@pytest.mark.parametrize(
    ("A", "expected"),
    [
        (np.eye(4), 4.0),
        (np.eye(5)[[2, 0, 4, 1, 3]], 5.0),
        (np.ones((4, 4)) / 4, 1.0),
        (np.diag([1.0, 1.0, 0.0, 0.0]), 2.0),
        (np.diag([3.0, 1.0]), 1.754765),
    ],
)
def test_erank_basic_values(A, expected):
    assert M.effective_rank(torch.tensor(A)).item() == pytest.approx(expected, rel=1e-6)


def test_erank_invariances_and_zero():
    g = torch.Generator().manual_seed(9)
    A = torch.randn(5, 5, dtype=torch.float64, generator=g)
    U, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64, generator=g))
    V, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64, generator=g))
    e = M.effective_rank(A)
    for B in (7.5 * A, A.T, U @ A @ V):
        torch.testing.assert_close(M.effective_rank(B), e)
    batch = torch.stack([A, torch.zeros(5, 5), torch.eye(5, dtype=torch.float64)])
    out = M.effective_rank(batch)
    assert out.shape == (3,) and torch.isnan(out[1]) and out[2].item() == pytest.approx(5.0)
    assert M.effective_rank(torch.eye(3, dtype=torch.float32)).dtype == torch.float64


def test_erank_closed_form_uniform_mixing():
    n, alpha, k = 4, 0.3, 5
    Malpha = (1 - alpha) * np.eye(n) + alpha * np.ones((n, n)) / n
    P = np.linalg.matrix_power(Malpha, k)
    r = (1 - alpha) ** k
    p = np.array([1.0] + [r] * (n - 1)) / (1 + (n - 1) * r)
    closed = np.exp(-(p * np.log(p)).sum())
    assert closed == pytest.approx(2.734787, abs=1e-6)
    assert M.effective_rank(torch.tensor(P)).item() == pytest.approx(2.734787, abs=1e-6)
    for r, expected in ((0.05, 1.700), (0.1, 2.212), (0.2, 2.926)):
        assert M.effective_rank(torch.tensor(_uniform_mix(4, r))).item() == pytest.approx(expected, abs=5e-4)


def test_product_convention_hand_built_two_layer_model():
    H0 = [[1.0, 1.0], [0.0, 1.0]]
    H1 = [[1.0, 0.0], [1.0, 1.0]]
    x0 = [2.0, 3.0]
    # explicit column-action recurrence x_{k+1}[i] = Σ_j H_k[i][j] x_k[j]
    x1 = [sum(H0[i][j] * x0[j] for j in range(2)) for i in range(2)]
    x2 = [sum(H1[i][j] * x1[j] for j in range(2)) for i in range(2)]
    H = torch.tensor([H0, H1])
    P = M.mixing_products(H, 0, 2)
    torch.testing.assert_close(P, torch.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=torch.float64))  # H1 @ H0
    torch.testing.assert_close(P @ torch.tensor(x0, dtype=torch.float64), torch.tensor(x2, dtype=torch.float64))
    torch.testing.assert_close(M.mixing_products(H, 1, 1), torch.eye(2, dtype=torch.float64))
    # batched over tokens: each token's product is its own
    Hb = torch.stack([H, H.flip(0)])  # token 1 has the layers in the other order
    Pb = M.mixing_products(Hb, 0, 2)
    torch.testing.assert_close(Pb[1], torch.tensor([[2.0, 1.0], [1.0, 1.0]], dtype=torch.float64))  # H0 @ H1
    with pytest.raises(ValueError):
        M.mixing_products(H, 1, 3)


def test_product_order_changes_erank_and_doubly_stochastic_gains():
    rng = np.random.default_rng(11)
    A, B, C = (_sinkhorn(rng.random((4, 4)) ** 3) for _ in range(3))
    assert not np.allclose(A, A.T)
    H = torch.tensor(np.stack([C, B, A]))  # x_3 = A B C x_0
    P = M.mixing_products(H, 0, 3)
    np.testing.assert_allclose(P.numpy(), A @ B @ C, atol=1e-12)
    e_abc, e_cba = M.effective_rank(torch.tensor(A @ B @ C)), M.effective_rank(torch.tensor(C @ B @ A))
    assert abs(e_abc - e_cba) > 1e-3
    torch.testing.assert_close(M.effective_rank(P), e_abc)
    fwd, bwd = M.amax_gain(P)
    assert fwd.item() == pytest.approx(1.0, abs=1e-6) and bwd.item() == pytest.approx(1.0, abs=1e-6)


def test_amax_gain_hand_values():
    fwd, bwd = M.amax_gain(torch.tensor([[1.0, -2.0], [3.0, 4.0]]))
    assert fwd.item() == 7.0 and bwd.item() == 6.0


def test_window_profile_constant_mixing_closed_form():
    n, alpha, K = 4, 0.3, 6
    Malpha = torch.tensor((1 - alpha) * np.eye(n) + alpha * np.ones((n, n)) / n)
    H = Malpha.expand(3, K, n, n)  # 3 tokens, K sublayers, all equal: window w product = M^w
    prof = M.window_profile(H, [1, 2, 4, 8])
    assert prof.shape == (3, 4)
    for col, w in enumerate([1, 2, 4]):
        expected = M.effective_rank(torch.tensor(_uniform_mix(n, (1 - alpha) ** w))).item()
        torch.testing.assert_close(prof[:, col], torch.full((3,), expected, dtype=torch.float64))
    assert torch.all(torch.isnan(prof[:, 3]))  # w = 8 > K


def test_window_profile_means_over_starts():
    # Token with H_0 = diag(1,0) (rank 1) and H_1 = H_2 = I: width-1 eranks (1, 2, 2) → mean 5/3.
    H = torch.stack([torch.diag(torch.tensor([1.0, 0.0])), torch.eye(2), torch.eye(2)])
    assert M.window_profile(H, [1])[0].item() == pytest.approx(5 / 3)
    assert M.window_profile(H, [3])[0].item() == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------------------
# dead prefix, kendall, late window


def test_dead_prefix_hand_profile():
    s = [0.01, 0.0, 0.04, 0.3, 0.01, 0.5]
    assert M.dead_prefix(s) == 3
    assert M.dead_prefix(s, eps=0.02) == 2
    assert M.dead_prefix(s, eps=0.6) == 6
    assert M.dead_prefix([0.05, 0.0]) == 0  # s_l == eps is not below eps
    with pytest.raises(ValueError):
        M.dead_prefix([np.nan, 0.01, 0.2])
    assert M.dead_prefix([np.nan, 0.01, 0.2], nan_policy="skip") == 2


def test_kendall_tau_hand_values():
    assert M.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert M.kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))  # tau-b with a tie
    assert M.kendall_tau([1, 2, np.nan, 3], [3, 2, 0, 1]) == pytest.approx(-1.0)
    assert np.isnan(M.kendall_tau([1, 1, 1], [1, 2, 3]))


@pytest.mark.parametrize(("L", "start", "n_window", "n_pairs"), [(8, 2, 6, 15), (16, 4, 12, 66), (32, 8, 24, 276)])
def test_late_window_and_pairs(L, start, n_window, n_pairs):
    assert M.late_window(L) == start
    pairs = M.late_pairs(L)
    assert pairs.shape == (n_pairs, 2)
    assert len(np.unique(pairs)) == n_window and pairs.min() == start and pairs.max() == L - 1
    assert np.all(pairs[:, 0] < pairs[:, 1])
    assert len({tuple(p) for p in pairs.tolist()}) == n_pairs


def test_late_window_rules():
    assert M.late_window(8, "half") == 4 and M.late_window(9, "quarter") == 2 and M.late_window(8, "zero") == 0
    assert M.late_window(8, 3) == 3
    assert M.late_pairs(4, 1).tolist() == [[1, 2], [1, 3], [2, 3]]
    for bad in ("third", 8, -1):
        with pytest.raises(ValueError):
            M.late_window(8, bad)


def test_loss_log_probs_positions():
    """log p at τ = 1..T−2 against a hand computation; the targets there are tokens[:, 2:]."""
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 5, dtype=torch.float64)
    got = M.loss_log_probs(logits)
    assert got.shape == (2, 4, 5) and got.dtype == torch.float32
    want = logits[:, 1:5] - logits[:, 1:5].exp().sum(-1, keepdim=True).log()
    torch.testing.assert_close(got, want.float())

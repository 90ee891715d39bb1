"""Causal score C(s, t) (docs/concepts.md#causal-score): structure, closed forms and independent re-implementations."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.diagnostics.causal.engine import causal_scores, future_cut_table, future_cuts, token_nll
from depthlens.errors import DepthlensError
from depthlens.models.residual.base import RunContext
from depthlens.runtime.evaldata import EvalData, random_eval_data
from helpers import debug_model

# ---------------------------------------------------------------------------------------------------------------
# a linear residual "model" implementing the LayeredLM protocol: h_{l+1} = h_l + keep · A_l h_l, no norm


class _LinearDesign:
    slug = "linear"
    multi_stream = False
    editable_view = True

    def view(self, state):
        return state["h"]

    def update_norm_dims(self):
        return 1


class LinearLM(torch.nn.Module):
    """f_l(h) = A_l h per token (no attention, no norm); logits = h U. Used by the causal and permutation tests."""

    def __init__(self, A: torch.Tensor, vocab: int = 11, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.A = torch.nn.Parameter(A.double(), requires_grad=False)  # (L, d, d)
        d = A.shape[-1]
        self.E = torch.nn.Parameter(torch.randn(vocab, d, generator=g, dtype=torch.float64), requires_grad=False)
        self.U = torch.nn.Parameter(torch.randn(d, vocab, generator=g, dtype=torch.float64), requires_grad=False)
        self.design = _LinearDesign()

    @property
    def n_layer(self) -> int:
        return self.A.shape[0]

    def context(self, seq_len, *, record=False, device=None):
        z = torch.zeros(seq_len, 2)
        return RunContext(cos=z, sin=z, record={} if record else None)

    def embed(self, tokens, ctx):
        return {"h": self.E[tokens]}

    def run_layers(
        self, state, ctx, start=0, stop=None, *, keep=None, unit="block", order=None, swap="body", on_layer=None
    ):
        stop = self.n_layer if stop is None else stop
        h = state["h"]
        for p in range(start, stop):
            A = self.A[order[p] if order is not None else p]
            u = h @ A.T
            if keep is not None and keep.get(p) is not None:
                u = u * keep[p].to(u.dtype)[..., None]
            h = h + u
            if on_layer is not None:
                on_layer(p, {"h": h}, u)
        return {"h": h}

    def final_hidden(self, state, ctx):
        return state["h"]

    def head(self, state, ctx):
        return state["h"] @ self.U


# ---------------------------------------------------------------------------------------------------------------
# fixtures


def _model(arch: str = "preln", n_layer: int = 4, seed: int = 0):
    return debug_model(arch, n_layer=n_layer, seed=seed)


@pytest.fixture(scope="module")
def preln():
    return _model("preln", 4)


EVAL = (3, 24, 1)  # n_seq, seq_len, seed of the shared `data` fixture (conftest.py)


@pytest.fixture(scope="module")
def ds(preln, data):
    return causal_scores(preln, data, direct=True, outputs=True, batch_size=4)


def _undefined_nan(ref: np.ndarray) -> np.ndarray:
    """A reference [.., s, t] matrix with the cells the engine leaves undefined (t < s) as NaN, as the engine does;
    the references compute them as 0 (blocks before s never see the skip)."""
    ref = np.array(ref, dtype=float)
    below = np.tril(np.ones(ref.shape[-2:], bool), -1)
    assert np.all(ref[..., below] == 0)  # the reference agrees that nothing is there
    ref[..., below] = np.nan
    return ref


# ---------------------------------------------------------------------------------------------------------------
# structure


def test_future_strictly_upper_triangular(ds):
    C = ds.causal_score.sel(variant="future").values  # (aggregator, s, t)
    L = C.shape[-1]
    lower = np.tril(np.ones((L, L), bool))
    assert np.all(np.isnan(C[:, np.tril(lower, -1)]))  # t < s: no measurement, NaN (never a 0 that means "none")
    assert np.all(C[:, np.eye(L, dtype=bool)] == 0)  # t = s: the future skip leaves u_s after the cut as it was
    assert np.all(C[:, ~lower] > 0)


def test_current_unit_diagonal_zero_lower(ds):
    C = ds.causal_score.sel(variant="current")
    for agg in ("max", "mean", "p95", "p99", "pooled"):
        m = C.sel(aggregator=agg).values
        np.testing.assert_allclose(np.diag(m), 1.0, rtol=1e-6)
        assert np.all(np.isnan(m[np.tril_indices(4, -1)]))  # undefined (t < s), NaN


def test_null_intervention_is_exactly_zero(ds):
    assert ds.null_score.values.tolist() == [0.0, 0.0]


def test_zero_output_layer_gives_zero_row(data):
    m = _model("preln", 4)
    with torch.no_grad():
        m.blocks[1].attn.fn.o_proj.weight.zero_()
        m.blocks[1].mlp.fn.down_proj.weight.zero_()
    d = causal_scores(m, data, variants=("current",), outputs=True, batch_size=4)
    C = d.causal_score.sel(variant="current")
    assert np.all(C.sel(aggregator=["max", "mean", "p95", "p99"]).values[:, 1, 1:] == 0)
    assert np.all(np.isnan(C.values[..., 1, :1]))  # t < s: undefined
    pooled = C.sel(aggregator="pooled").values[1]
    assert np.isnan(pooled[1]) and np.all(pooled[2:] == 0)  # 0/0 on its own (zero) update: undefined
    assert np.all(d.output_effect.values[:, 1] == 0) and np.all(d.skip_delta_loss.values[1] == 0)


def test_direct_effect_diagonal_zero(ds):
    Cd = ds.direct_score.values
    assert np.all(np.diagonal(Cd, axis1=-2, axis2=-1) == 0)
    # the last-but-one layer only feeds the last one directly: C_dir = C there
    np.testing.assert_allclose(Cd[..., 2, 3], ds.causal_score.values[..., 2, 3], rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# closed forms on the linear residual net


def test_linear_closed_form():
    g = torch.Generator().manual_seed(0)
    A = 0.3 * torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    lm = LinearLM(A)
    toks = torch.tensor([[0, 3]])  # one measured token (position 1)
    d = causal_scores(lm, EvalData.from_tokens(toks), variants=("current",), direct=True)
    h0 = lm.E[3]
    A0, A1, A2 = A
    expected01 = torch.linalg.norm(A1 @ A0 @ h0) / torch.linalg.norm(A1 @ (h0 + A0 @ h0))
    C = d.causal_score.sel(variant="current")
    for agg in ("max", "mean", "pooled"):
        assert C.sel(aggregator=agg).values[0, 1] == pytest.approx(float(expected01), rel=1e-5)
    # direct effect C_dir(0, 2) = |A2 A0 h0| / |A2 h2| (h2 = clean input of layer 2), no mediation via layer 1
    h1 = h0 + A0 @ h0
    h2 = h1 + A1 @ h1
    dir02 = torch.linalg.norm(A2 @ (A0 @ h0)) / torch.linalg.norm(A2 @ h2)
    assert d.direct_score.sel(variant="current", aggregator="max").values[0, 2] == pytest.approx(float(dir02), rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# prefix reuse + staircase batching vs a naive loop (one full forward per intervention)


def _mask(x, shape):
    """A slice of positions (same for every sequence) or an (N, T) bool mask → (N, T) bool mask."""
    if isinstance(x, slice):
        m = torch.zeros(shape, dtype=torch.bool)
        m[:, x] = True
        return m
    return torch.as_tensor(x, dtype=torch.bool)


def _naive(model, tokens, s_list, intervene, measure):
    """{s: (max, mean, pooled) matrices row, O, dloss} from full forwards with keep masks.

    intervene, measure: slices (same positions in every sequence) or (N, T) bool masks (per sequence)."""
    L, T = model.n_layer, tokens.shape[1]
    intervene, measure = _mask(intervene, tokens.shape), _mask(measure, tokens.shape)

    def run(keep=None):
        ctx = model.context(T)
        ups = {}
        st = model.run_layers(model.embed(tokens, ctx), ctx, keep=keep, on_layer=lambda p, s, u: ups.__setitem__(p, u))
        return ups, model.head(st, ctx)

    nd = model.design.update_norm_dims()  # Frobenius norm over (n, d) for multi-stream updates
    with torch.no_grad():
        clean, logits0 = run()
        clean = {t: u.flatten(start_dim=u.dim() - nd) for t, u in clean.items()}
        out = {}
        for s in s_list:
            keep = ~intervene
            new, logits = run({s: keep})
            new = {t: u.flatten(start_dim=u.dim() - nd) for t, u in new.items()}
            row = {}
            for t in range(s, L):
                diff = (new[t] - clean[t])[measure].double()
                den = clean[t][measure].double()
                r = diff.norm(dim=-1) / den.norm(dim=-1).clamp_min(1e-6)
                row[t] = (float(r.max()), float(r.mean()), float((diff.square().sum() / den.square().sum()).sqrt()))
            dp = (logits.softmax(-1) - logits0.softmax(-1)).norm(dim=-1)[measure]
            out[s] = (row, float(dp.max()), float((token_nll(logits, tokens) - token_nll(logits0, tokens)).mean()))
    return out


@pytest.mark.parametrize("variant", ["current", "future"])
def test_engine_equals_naive_loop(preln, data, variant):
    T = data.seq_len
    d = causal_scores(preln, data, variants=(variant,), n_cuts=1, outputs=True, batch_size=5, seq_batch=2)
    if variant == "current":
        intervene, measure = slice(1, T), slice(1, T)
    else:  # one cut per sequence, drawn per sequence from one seeded stream (docs/concepts.md#causal-score)
        c = torch.from_numpy(future_cut_table(T, data.n_seq, 1))  # (N, 1)
        pos = torch.arange(T)
        intervene, measure = (pos >= 1) & (pos < c), pos >= c
    ref = _naive(preln, data.tokens, range(4), intervene, measure)
    C = d.causal_score.sel(variant=variant)
    for s, (row, o, dl) in ref.items():
        for t, (mx, mean, pooled) in row.items():
            np.testing.assert_allclose(
                [C.sel(aggregator=a).values[s, t] for a in ("max", "mean", "pooled")],
                [mx, mean, pooled],
                rtol=2e-5,
                atol=1e-6,
            )
        assert d.output_effect.sel(variant=variant).values[s] == pytest.approx(o, rel=1e-4, abs=1e-7)
        if variant == "current":
            assert d.skip_delta_loss.values[s] == pytest.approx(dl, rel=1e-4, abs=1e-6)


def test_batched_equals_unbatched(preln, data):
    a = causal_scores(preln, data, variants=("current", "future"), outputs=True, batch_size=1)
    b = causal_scores(preln, data, variants=("current", "future"), outputs=True, batch_size=16, seq_batch=3)
    np.testing.assert_allclose(a.causal_score.values, b.causal_score.values, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.seq_max.values, b.seq_max.values, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.output_effect.values, b.output_effect.values, rtol=1e-4, atol=1e-7)


def test_late_layers_match_all_layers(preln, data, ds):
    late = causal_scores(preln, data, variants=("current",), layers="late")
    m = late.causal_score.sel(variant="current").values
    assert np.all(np.isnan(m[:, 0]))  # s = 0 not skipped: row undefined
    np.testing.assert_allclose(m[:, 1:], ds.causal_score.sel(variant="current").values[:, 1:], rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Csordás' test_effect, re-implemented with plain torch forward hooks on the blocks


def _merge_io(intervened, orig, t, no_skip_front=1):
    """Csordás merge_io: positions [no_skip_front, t) (t=None: to the end) take the intervened value."""
    out = orig.clone()
    out[:, no_skip_front:t] = intervened[:, no_skip_front:t]
    return out


def csordas_test_effect(model, tokens, positions, norm="update"):
    """Max over (cuts, measured positions) of |Δ'_i − Δ_i| / max(|Δ_i|, 1e-6); rows = skipped layer s.
    norm='resid' divides by the clean block input |h_i| instead of |Δ_i|."""
    L = len(model.blocks)
    inputs = {}

    def forward(skip=None, cut=None):
        deltas, handles = {}, []
        for i, blk in enumerate(model.blocks):

            def hook(mod, args, kwargs, output, i=i):
                h_in, (state, carry) = args[0]["h"], output
                h_out = state["h"]
                if i == skip:
                    h_out = _merge_io(h_in, h_out, cut)
                deltas[i] = (h_out - h_in).float()
                inputs[i] = h_in.float()
                return ({**state, "h": h_out}, carry)

            handles.append(blk.register_forward_hook(hook, with_kwargs=True))
        try:
            model(tokens)
        finally:
            for h in handles:
                h.remove()
        return deltas

    with torch.no_grad():
        clean = forward()
        den = dict(inputs) if norm == "resid" else clean
        C = np.zeros((L, L))
        for cut in positions:
            F = slice(0, None) if cut is None else slice(cut, None)
            for s in range(L):
                new = forward(s, cut)
                for i in range(L):
                    r = (new[i] - clean[i])[:, F].norm(dim=-1) / den[i][:, F].norm(dim=-1).clamp_min(1e-6)
                    C[s, i] = max(C[s, i], float(r.max()))
    return C


def csordas_run(model, tokens, n_chunks=4, seed=123, norm="update"):
    """Csordás' run(): random.seed(123) once, then per prompt test_future_max_effect (reshuffle
    range(8, T−4, 8), first N_CHUNKS) and a max over prompts; also returns every prompt's positions."""
    rng = random.Random(seed)  # `random.seed(123)` once per run; the global stream, made local
    C, cuts = None, []
    for n in range(tokens.shape[0]):
        positions = list(range(8, tokens.shape[1] - 4, 8))
        rng.shuffle(positions)
        positions = positions[:n_chunks]
        cuts.append(positions)
        Cn = csordas_test_effect(model, tokens[n : n + 1], positions, norm=norm)
        C = Cn if C is None else np.maximum(C, Cn)
    return C, cuts


def test_equals_csordas_test_effect(preln):
    data = random_eval_data(97, n_seq=4, seq_len=48, seed=1, bos_id=96)  # 4 cut positions to choose from
    d = causal_scores(preln, data, variants=("current", "future"), null=False, outputs=False)
    ours = d.causal_score.sel(aggregator="max")
    np.testing.assert_allclose(
        ours.sel(variant="current").values,
        _undefined_nan(csordas_test_effect(preln, data.tokens, [None])),
        rtol=1e-5,
        atol=1e-6,
    )
    ref, cuts = csordas_run(preln, data.tokens, n_chunks=2)
    d2 = causal_scores(preln, data, variants=("future",), n_cuts=2, null=False, outputs=False)
    np.testing.assert_allclose(
        d2.causal_score.sel(variant="future", aggregator="max").values, _undefined_nan(ref), rtol=1e-5, atol=1e-6
    )
    assert d2.attrs["cut_positions_json"] == f'{{"future": {cuts}}}'.replace("'", '"')
    assert len({tuple(c) for c in cuts}) > 1  # sequences get different cuts (not one draw for all)


def test_future_cuts_seeded_once_per_run():
    table = future_cut_table(64, 5, 4, seed=123)
    rng = random.Random(123)
    for row in table:  # Csordás: one seed, then every prompt reshuffles a fresh range(8, T−4, 8)
        positions = list(range(8, 60, 8))
        rng.shuffle(positions)
        assert row.tolist() == positions[:4]
    assert future_cuts(64, 4) == table[0].tolist()
    assert len({tuple(r) for r in table.tolist()}) > 1
    np.testing.assert_array_equal(future_cut_table(64, 3, 4), table[:3])  # a prefix of the run: same cuts
    assert future_cut_table(20, 3, 4).shape == (3, 1)  # only c = 8 fits: K = 1


def test_resid_norm_equals_hooks(preln, data):
    """norm='resid': |u_t' − u_t| / |h_t| with h_t the clean input of block t, read by plain forward hooks."""
    d = causal_scores(preln, data, variants=("current",), norm="resid", null=False)
    assert d.attrs["norm"] == "resid" and "residual" in d.attrs["norm_definition"]
    ref = _undefined_nan(csordas_test_effect(preln, data.tokens, [None], norm="resid"))
    np.testing.assert_allclose(
        d.causal_score.sel(variant="current", aggregator="max").values, ref, rtol=1e-5, atol=1e-6
    )
    # the diagonal is then the relative contribution max |u_s| / |h_s| (Csordás analyze_norms), not 1
    _, cache = preln.run_with_cache(data.tokens)
    for s in range(4):
        h = cache[f"blocks.{s}.hook_resid_pre"][:, 1:]
        u = cache[f"blocks.{s}.hook_attn_out"][:, 1:] + cache[f"blocks.{s}.hook_mlp_out"][:, 1:]
        assert d.causal_score.sel(variant="current", aggregator="max").values[s, s] == pytest.approx(
            float((u.norm(dim=-1) / h.norm(dim=-1)).max()), rel=1e-5
        )
    # the pooled aggregator and the per-sequence sums use the same denominators as the engine
    upd = causal_scores(preln, data, variants=("current",), norm="update", null=False)
    assert upd.attrs["norm"] == "update"
    np.testing.assert_allclose(d.seq_sq_change.values, upd.seq_sq_change.values, rtol=1e-6)  # same numerators
    with pytest.raises(DepthlensError, match="norm"):
        causal_scores(preln, data, norm="layer")


def test_resid_norm_linear_closed_form():
    g = torch.Generator().manual_seed(0)
    A = 0.3 * torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    lm = LinearLM(A)
    d = causal_scores(lm, EvalData.from_tokens(torch.tensor([[0, 3]])), variants=("current",), norm="resid")
    h0 = lm.E[3]
    A0, A1 = A[0], A[1]
    h1 = h0 + A0 @ h0
    C = d.causal_score.sel(variant="current")
    for agg in ("max", "mean", "pooled"):  # C(0, 1) = |A1 A0 h0| / |h1|;  C(0, 0) = |A0 h0| / |h0|
        assert C.sel(aggregator=agg).values[0, 1] == pytest.approx(
            float(torch.linalg.norm(A1 @ A0 @ h0) / torch.linalg.norm(h1)), rel=1e-6
        )
        assert C.sel(aggregator=agg).values[0, 0] == pytest.approx(
            float(torch.linalg.norm(A0 @ h0) / torch.linalg.norm(h0)), rel=1e-6
        )


# ---------------------------------------------------------------------------------------------------------------
# every design that this build can construct


@pytest.mark.parametrize("arch", SLUGS)
def test_all_designs_structure(arch, data):
    m = _model(arch, 3)
    d = causal_scores(m, data, n_cuts=2, outputs=True, batch_size=4)
    cur = d.causal_score.sel(variant="current", aggregator="max").values
    below = np.tril(np.ones((3, 3), bool), -1)
    assert np.all(np.isfinite(cur[~below])) and np.all(np.isnan(cur[below]))
    np.testing.assert_allclose(np.diag(cur), 1.0, rtol=1e-5)
    fut = d.causal_score.sel(variant="future").values
    assert np.all(np.isnan(fut[:, below])) and np.all(fut[:, np.eye(3, dtype=bool)] == 0)
    assert np.all(d.null_score.values == 0)
    assert d.attrs["skip_mode"].startswith(arch)
    # prefix reuse + staircase batching == one full forward per skip, for every design
    T = data.seq_len
    ref = _naive(m, data.tokens, [1, 2], slice(1, T), slice(1, T))
    for s, (row, o, _dl) in ref.items():
        for t, (mx, _mean, _pooled) in row.items():
            np.testing.assert_allclose(cur[s, t], mx, rtol=2e-5, atol=1e-6)
        assert d.output_effect.sel(variant="current").values[s] == pytest.approx(o, rel=1e-4, abs=1e-7)


def test_unit_and_errors(preln, data):
    m = causal_scores(preln, data, variants=("current",), unit="mlp", null=False)
    assert m.attrs["unit"] == "mlp"
    # skipping the MLP write of layer s leaves u'_s = a_s, so C(s, s) = max |m_s| / |a_s + m_s| (hooks)
    _, cache = preln.run_with_cache(data.tokens)
    for s in range(4):
        a, mo = cache[f"blocks.{s}.hook_attn_out"][:, 1:], cache[f"blocks.{s}.hook_mlp_out"][:, 1:]
        expected = float((mo.norm(dim=-1) / (a + mo).norm(dim=-1)).max())
        assert m.causal_score.sel(variant="current", aggregator="max").values[s, s] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(DepthlensError, match="variant"):
        causal_scores(preln, data, variants=("past",))
    with pytest.raises(DepthlensError, match="unit"):
        causal_scores(preln, data, unit="head")
    with pytest.raises(DepthlensError, match="seq_len >= 13"):
        causal_scores(preln, EvalData.from_tokens(data.tokens[:, :10]), variants=("future",))
    with pytest.raises(DepthlensError, match="layer"):
        causal_scores(preln, data, layers=[7])


def test_mean_downstream_effect(ds):
    C = ds.causal_score.sel(variant="current", aggregator="max").values
    md = ds.mean_downstream_effect.sel(variant="current", aggregator="max").values
    np.testing.assert_allclose(md[:3], [C[s, s + 1 :].mean() for s in range(3)])
    assert np.isnan(md[3])


def test_future_fewer_sequences_than_cuts(preln):
    """K cut slots per sequence, not N: one sequence with 4 cuts (the store was once sized by N)."""
    one = random_eval_data(97, n_seq=1, seq_len=48, seed=2, bos_id=96)
    d = causal_scores(preln, one, variants=("future",), n_cuts=4, null=False, outputs=False)
    ref, cuts = csordas_run(preln, one.tokens, n_chunks=4)
    assert len(cuts[0]) == 4
    np.testing.assert_allclose(
        d.causal_score.sel(variant="future", aggregator="max").values, _undefined_nan(ref), rtol=1e-5, atol=1e-6
    )


def test_measure_nothing_is_refused(preln, data):
    with pytest.raises(DepthlensError, match="nothing to compute"):
        causal_scores(preln, data, measure=False)

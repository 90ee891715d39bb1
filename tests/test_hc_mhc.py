"""HC and mHC: equivalences at init, peer and NumPy re-derivations, interventions, hooks, depth mixing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from einops import rearrange

from depthlens.models import ModelConfig, build_model
from depthlens.models.residual.base import SublayerCall, state_cat, state_repeat
from shared_weights import share_hc_router

DESIGNS = ["hc", "mhc"]
V = 97


def make(arch: str, seed: int = 0, **kw):
    model = build_model(ModelConfig.debug(arch, **kw), seed=seed)
    return model.eval()


def tokens(B: int = 2, T: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def randomize_routers(model, seed: int = 1) -> None:
    """Non-trivial maps: non-zero dynamic weights, perturbed static parts, larger gates."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if ".router_" not in name:
            continue
        r = torch.randn(p.shape, generator=g, dtype=p.dtype)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("dynamic_alpha_fn", "dynamic_beta_fn"):
            p.copy_(0.5 * r)
        elif leaf.endswith("_scale") or leaf.startswith("alpha_"):
            p.copy_(0.5 + 0.1 * r)
        elif leaf in ("static_alpha", "static_beta", "bias"):
            p.add_(0.3 * r)
        elif leaf == "weight":  # HC norm gain
            p.copy_(1.0 + 0.1 * r)


def clean_states(model, tok):
    """States before every layer (index l) and after the last (index L), plus the updates u_l."""
    ctx = model.context(tok.shape[1])
    states, updates = [model.embed(tok, ctx)], []
    model.run_layers(states[0], ctx, on_layer=lambda pos, s, u: (states.append(s), updates.append(u)))
    return ctx, states, updates


# --- structure --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", DESIGNS)
def test_parameter_counts_and_names(arch):
    model = make(arch)
    d, n = model.config.d_model, model.config.hc_streams
    router = model.blocks[0].router_attn
    count = sum(p.numel() for p in router.parameters())
    if arch == "hc":
        assert count == d * (n + 3) + n * n + 2 * n + 2 == 7 * d + 26
        shapes = {k: tuple(v.shape) for k, v in router.named_parameters()}
        assert shapes == {
            "static_alpha": (n, n + 1),
            "static_beta": (n,),
            "norm.weight": (d,),
            "dynamic_alpha_fn": (d, n + 1),
            "dynamic_alpha_scale": (),
            "dynamic_beta_fn": (d,),
            "dynamic_beta_scale": (),
        }
    else:
        assert count == n * d * (n * n + 2 * n) + (n * n + 2 * n) + 3 == 96 * d + 27
        assert {k for k, _ in router.named_parameters()} == {"phi", "bias", "alpha_pre", "alpha_post", "alpha_res"}
    design = model.design
    assert design.multi_stream and not design.editable_view and design.update_norm_dims() == 2
    assert design.view_name == "sum over the n streams"


def test_hc_static_init_and_readout():
    model = make("hc", hc_streams=3)
    n = 3
    for j in range(model.config.n_sublayer):
        blk = model.blocks[j // 2]
        r = (blk.router_attn, blk.router_mlp)[j % 2].readout()
        assert torch.equal(r["A_m"], torch.eye(n)[j % n])  # e_{j mod n}, j the sublayer index
        assert torch.equal(r["A_r"], torch.eye(n)) and torch.equal(r["B"], torch.ones(n))
        hc = torch.zeros(n + 1, n + 1)
        hc[0, 1:], hc[1:, 0], hc[1:, 1:] = 1.0, torch.eye(n)[j % n], torch.eye(n)
        assert torch.equal(r["hc_matrix"], hc)
        assert r["s_alpha"] == pytest.approx(0.01) and r["s_beta"] == pytest.approx(0.01)


# --- equivalences at init -----------------------------------------------------------------------------------


@pytest.mark.parametrize("collapse", ["sum", "mean"])
def test_hc_at_init_equals_preln(collapse):
    # tiny eps: the final norm sees n*h (sum collapse), and eps is the only thing that tells n*h from h
    kw = dict(norm_eps=1e-10, hc_collapse=collapse)
    pre, hc = make("preln", seed=0, **kw), make("hc", seed=1, **kw)
    missing, unexpected = hc.load_state_dict(pre.state_dict(), strict=False)
    assert not unexpected and missing and all(".router_" in k for k in missing)
    tok = tokens()
    torch.testing.assert_close(hc(tok), pre(tok), atol=1e-5, rtol=0)

    _, s_pre, _ = clean_states(pre, tok)
    ctx, s_hc, _ = clean_states(hc, tok)
    n = hc.config.hc_streams
    for a, b in zip(s_pre, s_hc):
        x = b["x"]  # (B, T, n, d)
        assert x.shape[2] == n
        for s in range(n):  # every stream is the Pre-LN residual
            torch.testing.assert_close(x[:, :, s], a["h"], atol=1e-6, rtol=0)
    scale = n if collapse == "sum" else 1
    torch.testing.assert_close(hc.final_hidden(s_hc[-1], ctx), scale * s_pre[-1]["h"], atol=1e-6, rtol=0)


def _sk_numpy(logits: np.ndarray, iters: int) -> np.ndarray:
    m = np.exp(logits)
    for _ in range(iters):
        m = m / m.sum(-2, keepdims=True)
        m = m / m.sum(-1, keepdims=True)
    return m


@pytest.mark.parametrize("init", ["zero", "identity"])
def test_mhc_at_init_doubly_stochastic(init):
    model = make("mhc", mhc_init=init)
    rec = model.readouts(tokens())
    t_max = model.config.mhc_sinkhorn_iters
    col_tol = 1e-6 if init == "zero" else 1e-4  # near-identity logits converge slower in 20 Sinkhorn steps
    for j in range(model.config.n_sublayer):
        H = rec[f"sub{j}.H_res"].double().numpy()  # (B, T, n, n) [dest, source]
        row_err = np.abs(H.sum(-1) - 1).max(-1)
        col_err = np.abs(H.sum(-2) - 1).max(-1)
        np.testing.assert_allclose(rec[f"sub{j}.sinkhorn_row_err"].numpy(), row_err, atol=5e-7)  # fp32 vs fp64 sums
        np.testing.assert_allclose(rec[f"sub{j}.sinkhorn_col_err"].numpy(), col_err, atol=5e-7)
        assert row_err.max() < 1e-6 and col_err.max() < col_tol
        np.testing.assert_allclose(H, _sk_numpy(rec[f"sub{j}.H_res_logits"].double().numpy(), t_max), atol=1e-6)
        np.testing.assert_allclose(rec[f"sub{j}.res_map"].numpy(), H, atol=0)
        if init == "zero":  # Megatron static point (alpha = 0.01, b = 0): H^pre ~ 1/2, H^post ~ 1, H^res ~ J/n
            assert np.abs(rec[f"sub{j}.H_pre"].numpy() - 0.5).max() < 0.05
            assert np.abs(H - 0.25).max() < 0.05
        else:  # MindFormers: b_pre = -log 3 -> H^pre = 1/4, b_res = 5(I - 1) -> H^res ~ I
            assert np.abs(rec[f"sub{j}.H_pre"].numpy() - 0.25).max() < 0.01
            assert np.diagonal(H, axis1=-2, axis2=-1).min() > 0.95
        assert np.abs(rec[f"sub{j}.H_post"].numpy() - 1.0).max() < 0.1


# --- peers and re-derivations ---------------------------------------------------------------------------


def _peer(hcpkg, router, d: int, k: int):
    """lucidrains HyperConnections for sublayer k carrying `router`'s parameters (norm gamma = our gain - 1)."""
    peer = hcpkg.HyperConnections(4, dim=d, layer_index=k)
    share_hc_router(router, peer, into="peer")
    return peer


@torch.no_grad()
def test_hc_matches_lucidrains_hyper_connections():
    hcpkg = pytest.importorskip("hyper_connections")
    init_hc, expand, reduce = hcpkg.get_init_and_expand_reduce_stream_functions(4)
    # eps ~ 0: lucidrains' norm is F.normalize(x) * sqrt(d) * (gamma + 1) (eps only in the L2 clamp)
    model = make("hc", norm_eps=1e-12)
    d, n, tok = model.config.d_model, 4, tokens()
    for l, blk in enumerate(model.blocks):  # the static init agrees: A_m^0 = e_{k mod n}, k the sublayer
        for i, r in enumerate((blk.router_attn, blk.router_mlp)):
            ref = init_hc(dim=d, branch=None, layer_index=2 * l + i)
            assert torch.equal(r.static_alpha, ref.static_alpha) and torch.equal(r.static_beta, ref.static_beta)
    randomize_routers(model)
    ctx = model.context(tok.shape[1])
    peers = [
        [_peer(hcpkg, r, d, 2 * l + i) for i, r in enumerate((b.router_attn, b.router_mlp))]
        for l, b in enumerate(model.blocks)
    ]

    # one sublayer on random streams
    X = torch.randn(2, tok.shape[1], n, d, generator=torch.Generator().manual_seed(3))
    body = model.blocks[1].attn
    seen = {}

    def branch(x):
        seen["ours"] = x
        return body(x, ctx.cos, ctx.sin)

    ours, _ = model.blocks[1].router_attn({"x": X}, SublayerCall(branch, body, j=2, pos=1, ctx=ctx))
    x_in, add_res = peers[1][0](rearrange(X, "b t s d -> (b s) t d"))
    theirs = rearrange(add_res(body(x_in, ctx.cos, ctx.sin)), "(b s) t d -> b t s d", s=n)
    torch.testing.assert_close(seen["ours"], x_in, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours["x"], theirs, atol=1e-5, rtol=1e-5)

    # the whole stack: expand -> 2L lucidrains HC sublayers around our bodies -> reduce(sum) -> our head
    H = expand(model.embed_tokens(tok))  # ((B s), T, d), streams folded into the batch
    for l, blk in enumerate(model.blocks):
        for peer, sub in zip(peers[l], (blk.attn, blk.mlp)):
            x_in, add_res = peer(H)
            H = add_res(sub(x_in, ctx.cos, ctx.sin))
    logits_peer = model.lm_head(model.norm(reduce(H)))
    torch.testing.assert_close(model(tok), logits_peer, atol=1e-5, rtol=1e-5)


def _mhc_numpy(x, phi, bias, a_pre, a_post, a_res, eps, t_max):
    """Eq. 7-9 in NumPy (fp64). x (B, T, n, d). Returns H_pre, H_post, H_res (row = destination)."""
    B, T, n, d = x.shape
    flat = x.reshape(B, T, n * d)
    xn = flat / np.sqrt((flat**2).mean(-1, keepdims=True) + eps)
    z = xn @ phi
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    H_pre = sig(a_pre * z[..., :n] + bias[:n])
    H_post = 2.0 * sig(a_post * z[..., n : 2 * n] + bias[n : 2 * n])
    res = (a_res * z[..., 2 * n :] + bias[2 * n :]).reshape(B, T, n, n)
    return H_pre, H_post, _sk_numpy(res, t_max)


@pytest.mark.parametrize(
    "dtype,t_max,tol", [(torch.float64, 20, 1e-6), (torch.float64, 2, 1e-6), (torch.float32, 20, 2e-5)]
)
@torch.no_grad()
def test_mhc_matches_numpy_eq7_9(dtype, t_max, tol):
    # t_max = 2 stops far from convergence, so the column-then-row order is visible
    model = make("mhc", mhc_sinkhorn_iters=t_max)
    randomize_routers(model)
    model = model.to(dtype)
    n, d, T = 4, model.config.d_model, 6
    X = torch.randn(2, T, n, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(dtype)
    ctx = model.context(T, record=True)
    blk, seen = model.blocks[1], {}

    def branch(u):
        seen["u"] = u
        seen["y"] = blk.mlp(u, ctx.cos, ctx.sin)
        return seen["y"]

    out, carry = blk.router_mlp({"x": X}, SublayerCall(branch, blk.mlp, j=3, pos=1, ctx=ctx))
    r = blk.router_mlp
    p = lambda t: t.detach().double().numpy()  # noqa: E731
    H_pre, H_post, H_res = _mhc_numpy(
        p(X),
        p(r.phi),
        p(r.bias),
        float(r.alpha_pre),
        float(r.alpha_post),
        float(r.alpha_res),
        model.config.norm_eps,
        model.config.mhc_sinkhorn_iters,
    )
    assert np.abs(H_res - 0.25).max() > 0.05  # the maps are far from the init
    if t_max == 2:
        assert np.abs(H_res.sum(-2) - 1).max() > 1e-4  # unconverged: columns off, rows exact
    u = np.einsum("btn,btnd->btd", H_pre, p(X))
    x_next = np.einsum("btik,btkd->btid", H_res, p(X)) + H_post[..., None] * p(seen["y"])[:, :, None, :]
    np.testing.assert_allclose(p(ctx.record["sub3.H_res"]), H_res, atol=tol, rtol=0)
    np.testing.assert_allclose(p(seen["u"]), u, atol=tol, rtol=tol)
    np.testing.assert_allclose(p(out["x"]), x_next, atol=tol, rtol=tol)
    np.testing.assert_allclose(p(carry), H_post[..., None] * p(seen["y"])[:, :, None, :], atol=tol, rtol=tol)


# --- interventions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", DESIGNS)
@torch.no_grad()
def test_update_is_layer_write(arch):
    """u_l = X_{l+1} - R_{2l+1} R_{2l} X_l (docs/concepts.md#notation), recorded res maps in column convention."""
    model = make(arch)
    randomize_routers(model)
    tok = tokens()
    ctx = model.context(tok.shape[1], record=True)
    states, updates = [model.embed(tok, ctx)], []
    model.run_layers(states[0], ctx, on_layer=lambda pos, s, u: (states.append(s), updates.append(u)))
    for l, u in enumerate(updates):
        R0, R1 = ctx.record[f"sub{2 * l}.res_map"], ctx.record[f"sub{2 * l + 1}.res_map"]
        mixed = torch.einsum("btij,btjk,btkd->btid", R1, R0, states[l]["x"])
        assert u.shape == states[l]["x"].shape
        torch.testing.assert_close(u, states[l + 1]["x"] - mixed, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", DESIGNS)
@torch.no_grad()
def test_prefix_reuse_and_batched_interventions(arch):
    model = make(arch)
    randomize_routers(model)
    tok, L = tokens(), model.n_layer
    ctx, states, updates = clean_states(model, tok)
    full = model.head(states[-1], ctx)
    torch.testing.assert_close(model(tok), full, atol=0, rtol=0)
    for k in range(1, L):  # prefix reuse: start from the cached state before layer k
        torch.testing.assert_close(
            model.head(model.run_layers(states[k], ctx, start=k), ctx), full, atol=1e-6, rtol=1e-6
        )

    # three interventions from the cached state before layer 1, stacked along the batch
    B, T = tok.shape
    ones = torch.ones(B, T)
    late = ones.clone()
    late[:, 1:] = 0
    mid = ones.clone()
    mid[:, 2:5] = 0
    masks = [{1: late}, {2: mid}, {1: mid, 3: late}]
    single = [model.head(model.run_layers(states[1], ctx, start=1, keep=m), ctx) for m in masks]
    keep = {p: torch.cat([m.get(p, ones) for m in masks], 0) for p in (1, 2, 3)}
    batched = model.head(model.run_layers(state_repeat(states[1], 3), ctx, start=1, keep=keep), ctx)
    torch.testing.assert_close(batched, torch.cat(single, 0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state_cat([states[1], states[1]])["x"], state_repeat(states[1], 2)["x"])
    assert (single[0] - full).abs().max() > 1e-4  # the skip does something

    # order with swap(i, i) is a no-op, for both swap modes
    for swap in ("body", "all"):
        torch.testing.assert_close(model(tok, order=list(range(L)), swap=swap), full, atol=0, rtol=0)


@pytest.mark.parametrize("arch", DESIGNS)
@torch.no_grad()
def test_skip_modes(arch):
    tok, s = tokens(), 2
    T = tok.shape[1]
    keep = torch.ones(tok.shape)
    keep[:, 1:] = 0
    out = {}
    # mHC's identity init starts H^res ~ I, where dropping the mixing is (rightly) nearly a no-op: use the
    # uniform (Megatron) init, far from I, so the two skip modes must differ
    extra = {"mhc_init": "zero"} if arch == "mhc" else {}
    for mode in ("mix", "identity"):
        model = make(arch, multistream_skip=mode, **extra)
        randomize_routers(model)
        for lin in (model.blocks[s].attn.fn.o_proj, model.blocks[s].mlp.fn.down_proj):
            lin.weight.zero_()  # layer s writes nothing
        out[mode] = model(tok), model(tok, keep={s: keep})
        ctx = model.context(T)
        _, states, _ = clean_states(model, tok)
        skipped = model.run_layers(states[s], ctx, start=s, stop=s + 1, keep={s: keep})
        if mode == "identity":  # X_{s+1} = X_s on the skipped tokens
            torch.testing.assert_close(skipped["x"][:, 1:], states[s]["x"][:, 1:], atol=0, rtol=0)
    clean, skip_mix = out["mix"]
    torch.testing.assert_close(skip_mix, clean, atol=1e-6, rtol=1e-6)  # dropping a zero write changes nothing
    assert (out["identity"][1] - clean).abs().max() > 1e-4  # ... but dropping the mixing does

    if arch == "hc":  # at init A_r = I exactly, so both skip modes coincide
        res = [make("hc", multistream_skip=m)(tok, keep={1: keep}) for m in ("mix", "identity")]
        torch.testing.assert_close(res[0], res[1], atol=0, rtol=0)


@pytest.mark.parametrize("arch", DESIGNS)
@torch.no_grad()
def test_swap_body_vs_all(arch):
    model = make(arch)
    randomize_routers(model)
    tok, order = tokens(), [0, 2, 1, 3]
    body, all_ = model(tok, order=order, swap="body"), model(tok, order=order, swap="all")
    assert (body - all_).abs().max() > 1e-4  # routers differ: moving them matters
    for blk in model.blocks[1:]:  # identical routers everywhere: the two swap modes agree
        blk.router_attn.load_state_dict(model.blocks[0].router_attn.state_dict())
        blk.router_mlp.load_state_dict(model.blocks[0].router_mlp.state_dict())
    torch.testing.assert_close(
        model(tok, order=order, swap="body"), model(tok, order=order, swap="all"), atol=0, rtol=0
    )


# --- hooks and nnsight ------------------------------------------------------------------------------------


def _no_hooks_left(model) -> None:
    assert all(not h.fwd_hooks and not h.bwd_hooks for h in model.hook_dict.values())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("arch", DESIGNS)
@torch.no_grad()
def test_stream_hooks(arch):
    model = make(arch)
    randomize_routers(model)
    tok = tokens()
    B, T = tok.shape
    n, d = model.config.hc_streams, model.config.d_model
    ref, cache = model.run_with_cache(tok)
    for l in range(model.n_layer):
        assert cache[f"blocks.{l}.hook_streams_post"].shape == (B, T, n, d)
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_post"], cache[f"blocks.{l}.hook_streams_post"].sum(2))
    _no_hooks_left(model)

    def edit_row1(x, hook):
        x = x.clone()
        x[1, :, 0] *= 3.0
        return x

    edited = model.run_with_hooks(tok, fwd_hooks=[("blocks.1.hook_streams_post", edit_row1)])
    torch.testing.assert_close(edited[0], ref[0], atol=0, rtol=0)
    assert (edited[1] - ref[1]).abs().max() > 1e-4
    _no_hooks_left(model)

    with pytest.raises(RuntimeError, match="read-only"):
        model.run_with_hooks(tok, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: x * 2)])
    _no_hooks_left(model)


@torch.no_grad()
def test_nnsight_invokes_do_not_leak_across_rows():
    nnsight = pytest.importorskip("nnsight")

    class BatchedNNsight(nnsight.NNsight):  # batching invokes on a tensor-input model
        def _batch_size(self, *inputs, **kw):
            return inputs[0].shape[0] if inputs else 0

        def _batch(self, invokes, fn):
            if len(invokes) == 1:
                return invokes[0]
            return (torch.cat([inp[0] for inp, _ in invokes], 0),), {}

    model = make("hc")
    randomize_routers(model)
    tok = tokens()
    ref = model(tok)
    expect = model.run_with_hooks(tok[1:], fwd_hooks=[("blocks.1.hook_streams_post", lambda x, hook: x * 3.0)])
    traced = BatchedNNsight(model)
    with traced.trace() as tracer:
        with tracer.invoke(tok[:1]):
            out0 = traced.output.save()
        with tracer.invoke(tok[1:]):
            hp = traced.blocks[1].hook_streams_post
            hp.output = hp.output * 3.0  # (1, T, n, d): this invoke's rows only
            out1 = traced.output.save()
    torch.testing.assert_close(out0, ref[:1], atol=1e-6, rtol=1e-6)  # the other invoke is untouched
    torch.testing.assert_close(out1, expect, atol=1e-6, rtol=1e-6)
    assert (out1 - ref[1:]).abs().max() > 1e-4
    _no_hooks_left(model)


# --- depth mixing -----------------------------------------------------------------------------------------


@torch.no_grad()
def test_depth_mixing_hc_at_init_is_preln_scaled():
    pre, hc = make("preln"), make("hc")
    tok = tokens()
    M_pre, M_hc = pre.depth_mixing(tok), hc.depth_mixing(tok)
    n = hc.config.hc_streams
    torch.testing.assert_close(M_hc[..., :-1], M_pre[..., :-1])  # sublayer inputs: lower-triangular ones
    torch.testing.assert_close(M_hc[..., -1], n * M_pre[..., -1])  # the sum collapse carries n h


@torch.no_grad()
def test_depth_mixing_hand_computed_n2():
    model = make("hc", n_layer=1, hc_streams=2, hc_dynamic=False)
    r_attn, r_mlp = model.blocks[0].router_attn, model.blocks[0].router_mlp
    # static maps: static_alpha = [A_m | A_r] with A_r[source, dest]; B the write weights
    Am0, Ar0, B0 = np.array([0.7, 0.4]), np.array([[0.9, 0.2], [-0.3, 1.1]]), np.array([1.5, -0.5])
    Am1, Ar1, B1 = np.array([0.2, 1.3]), np.array([[1.2, 0.5], [0.1, 0.8]]), np.array([0.6, 2.0])
    for r, Am, Ar, Bv in ((r_attn, Am0, Ar0, B0), (r_mlp, Am1, Ar1, B1)):
        r.static_alpha.copy_(torch.tensor(np.concatenate([Am[:, None], Ar], 1)))
        r.static_beta.copy_(torch.tensor(Bv))
    R0, R1, one = Ar0.T, Ar1.T, np.ones(2)  # column convention: X' = A_r^T X + B^T y
    expect = np.zeros((3, 3))  # [source, destination]; sources: h0, y0 (attn), y1 (mlp); dest: u0, u1, h_L
    expect[0, 0] = Am0 @ one
    expect[0, 1], expect[1, 1] = Am1 @ R0 @ one, Am1 @ B0
    expect[0, 2], expect[1, 2], expect[2, 2] = one @ R1 @ R0 @ one, one @ R1 @ B0, one @ B1
    tok = tokens()
    M = model.depth_mixing(tok)
    assert M.shape == (2, tok.shape[1], 3, 3)
    np.testing.assert_allclose(M[0, 0].numpy(), expect, rtol=1e-6)
    np.testing.assert_allclose(M[1, -1].numpy(), expect, rtol=1e-6)


@pytest.mark.parametrize("arch", DESIGNS)
@torch.no_grad()
def test_depth_mixing_reconstructs_every_input(arch):
    """With dynamic maps, u_j = sum_i M[i -> j] source_i exactly, per token (and h_L for j = 2L)."""
    model = make(arch)
    randomize_routers(model)
    tok = tokens()
    M = model.depth_mixing(tok)
    _, cache = model.run_with_cache(tok)
    L = model.n_layer
    srcs = [cache["hook_embed"]] + [cache[f"blocks.{j // 2}.hook_{('attn', 'mlp')[j % 2]}_out"] for j in range(2 * L)]
    dests = [cache[f"blocks.{j // 2}.hook_{('attn', 'mlp')[j % 2]}_in"] for j in range(2 * L)]
    dests.append(cache["hook_resid_final"])
    S = torch.stack(srcs, 2).double()  # (B, T, 2L+1, d)
    for j, dest in enumerate(dests):
        recon = torch.einsum("bts,btsd->btd", M[..., :, j], S)
        torch.testing.assert_close(recon, dest.double(), atol=1e-5, rtol=1e-5)
    assert torch.all(M.tril(-1) == 0)  # source i > j never feeds sublayer j


def _numpy_erank(P: np.ndarray) -> np.ndarray:
    """Roy & Vetterli effective rank exp(H(sigma / sum sigma)) with NumPy's SVD, over the last two dims."""
    sv = np.linalg.svd(P, compute_uv=False)
    p = sv / sv.sum(-1, keepdims=True)
    return np.exp(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1))


@pytest.mark.parametrize("init,lo,hi", [("identity", 3.0, 4.0 + 1e-9), ("zero", 1.0 - 1e-9, 1.0 + 1e-6)])
def test_mhc_init_sets_the_rank_of_the_untrained_full_product(init, lo, hi):
    """The readout must not just report the init: identity init starts near full rank (n = 4), Megatron's
    zero init at exactly rank 1 (every H^res = J/n). Sinkhorn, the product and the erank are re-derived in
    NumPy float64 from the recorded logits (the logits themselves are checked against Eq. 7-9 above)."""
    from depthlens.diagnostics.rank.engine import product_tokens, res_maps

    L = 4
    model = make("mhc", mhc_init=init, n_layer=L)
    rec = model.readouts(tokens(T=12))
    P = None
    for j in range(2 * L):
        H_np = _sk_numpy(rec[f"sub{j}.H_res_logits"].double().numpy(), model.config.mhc_sinkhorn_iters)
        P = H_np if P is None else H_np @ P  # later factor on the left
    erank_np = _numpy_erank(P[:, 1:]).reshape(-1)  # BOS position excluded, as the engine does
    H = res_maps(rec, 2 * L)[:, 1:]
    tok = product_tokens(H.reshape(-1, *H.shape[2:]), L, [1])
    np.testing.assert_allclose(tok["erank_full"].numpy(), erank_np, atol=1e-5)
    assert lo <= erank_np.min() and erank_np.max() <= hi


def test_mhc_old_checkpoints_load_with_zero_init(tmp_path):
    """A checkpoint written before `mhc_init` existed was trained with b = 0; it must load as "zero"."""
    import json

    import depthlens

    model = make("mhc", mhc_init="zero")
    path = depthlens.save(model, tmp_path / "old")
    meta = json.loads((path / "config.json").read_text())
    del meta["model"]["mhc_init"]
    (path / "config.json").write_text(json.dumps(meta))
    assert depthlens.load(path).model.config.mhc_init == "zero"
    assert ModelConfig.debug("mhc").mhc_init == "identity"


@pytest.mark.parametrize("init", ["zero", "identity"])
def test_rank_flags_structurally_zero_gradient_maps(init):
    """First and last mHC maps cannot receive gradient (replicated input + row sums 1; sum collapse +
    column sums 1): the flag must say so, and a real backward pass must agree."""
    from depthlens.diagnostics.rank.engine import res_maps, structural_zero_grad

    model = make("mhc", mhc_init=init, n_layer=2, mhc_sinkhorn_iters=200).train()  # columns converge too
    with torch.no_grad():  # both inits start with identical streams (all gradients ~0): make them differ
        randomize_routers(model)
    toks = tokens(T=12)
    H = res_maps(model.readouts(toks), 4)[:, 1:].reshape(-1, 4, 4, 4)
    flags = structural_zero_grad(H, constrained=True)
    assert flags[0] and flags[-1]
    assert not structural_zero_grad(H, constrained=False).any()
    logits = model(toks)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), toks.roll(-1, 1).flatten()).backward()
    routers = [mod for mod in model.modules() if type(mod).__name__ == "MHCRouter"]
    g = [float(r.bias.grad[2 * 4 :].abs().max()) for r in routers]  # gradient of the b_res entries
    assert g[0] < 1e-6 * max(g[1:-1]) + 1e-9  # first map: exactly zero up to rounding
    assert g[-1] < 0.1 * max(g[1:-1])  # last map: zero up to the (small) Sinkhorn column residual

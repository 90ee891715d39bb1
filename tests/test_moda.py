"""MoDA, pre-norm variant (docs/designs.md#moda, docs/concepts.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from depthlens.models import ModelConfig, build_model
from depthlens.models.backbone import apply_rope
from depthlens.models.residual.base import state_cat, state_repeat
from depthlens.models.residual.moda import depth_attention
from depthlens.models.summary import summarize

L, B, T = 5, 2, 9


def make(seed: int = 0, **kw):
    base = dict(n_layer=L, n_head=4, n_kv_head=2)  # GQA, G = 2
    base.update(kw)
    return build_model(ModelConfig.debug("moda", **base), seed=seed).eval()


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


def run(m, toks, start_state=None, start: int = 0, **kw) -> torch.Tensor:
    ctx = m.context(toks.shape[1])
    state = m.embed(toks, ctx) if start_state is None else start_state
    return m.head(m.run_layers(state, ctx, start, **kw), ctx)


def states_before_layers(m, toks, **kw) -> list[dict]:
    """states[l] = the state entering layer l (l = 0..L)."""
    ctx = m.context(toks.shape[1])
    out = [m.embed(toks, ctx)]
    m.run_layers(out[0], ctx, on_layer=lambda pos, s, u: out.append(s), **kw)
    return out


def capture(m, toks, *suffixes, **run_kw):
    return m.run_with_cache(toks, names_filter=lambda n: n.endswith(suffixes), **run_kw)[1]


def numpy_moda(q, k, v, qd, dk, dv, dvalid):
    """Loop re-derivation: per batch, query head h (KV head h // G) and token t, one softmax over the
    causal sequence keys and the token's valid depth slots, scale 1/sqrt(e). Shapes as depth_attention."""
    q, k, v, qd, dk, dv = (x.detach().double().numpy() for x in (q, k, v, qd, dk, dv))
    dvalid = dvalid.numpy()
    Bq, Hq, Tq, e = q.shape
    G = Hq // k.shape[1]
    o = np.zeros_like(q)
    for b in range(Bq):
        for h in range(Hq):
            g = h // G
            for t in range(Tq):
                slots = np.flatnonzero(dvalid[b, t])
                logits = np.concatenate([k[b, g, : t + 1] @ q[b, h, t], dk[b, t, slots, g] @ qd[b, h, t]]) / np.sqrt(e)
                a = np.exp(logits - logits.max())
                a /= a.sum()
                o[b, h, t] = a @ np.concatenate([v[b, g, : t + 1], dv[b, t, slots, g]])
    return torch.from_numpy(o).float()


def random_operands(S: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return r(B, 4, T, 8), r(B, 2, T, 8), r(B, 2, T, 8), r(B, 4, T, 8), r(B, T, S, 2, 8), r(B, T, S, 2, 8)


# --- the operator --------------------------------------------------------------------------------------
def test_operator_matches_moda_attention_naive():
    moda = pytest.importorskip("moda")
    q, k, v, _, dk, dv = random_operands(S=4)
    o, parts = depth_attention(q, k, v, q, (dk, dv, torch.ones(B, T, 4, dtype=torch.bool)))
    # its depth cache is token-major: entry t * L + l holds slot l of token t
    flat = lambda x: rearrange(x, "b t s h e -> b h (t s) e")  # noqa: E731
    ref = moda.moda_attention_naive(q, k, v, flat(dk), flat(dv), num_layers=4)
    torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-6)
    total = parts["a_seq"].sum(-1) + parts["a_depth"].sum(-1)
    torch.testing.assert_close(total, torch.ones_like(total))
    # an invalid slot is exactly a missing slot
    valid = torch.ones(B, T, 4, dtype=torch.bool)
    valid[:, :, 1] = False
    o_masked, _ = depth_attention(q, k, v, q, (dk, dv, valid))
    keep = [0, 2, 3]
    ref = moda.moda_attention_naive(q, k, v, flat(dk[:, :, keep]), flat(dv[:, :, keep]), num_layers=3)
    torch.testing.assert_close(o_masked, ref, rtol=1e-5, atol=1e-6)


def test_operator_matches_loop_reference_with_separate_depth_query_and_per_token_masks():
    q, k, v, qd, dk, dv = random_operands(S=3, seed=1)
    valid = torch.rand(B, T, 3, generator=torch.Generator().manual_seed(2)) > 0.4
    o, _ = depth_attention(q, k, v, qd, (dk, dv, valid))
    torch.testing.assert_close(o, numpy_moda(q, k, v, qd, dk, dv, valid), rtol=1e-5, atol=1e-6)


def test_operator_without_depth_is_causal_gqa_attention():
    q, k, v, *_ = random_operands(S=0)
    o, parts = depth_attention(q, k, v, q, None)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-6)
    assert parts["a_depth"].shape == (B, 4, T, 0)


# --- the model -----------------------------------------------------------------------------------------
def test_parameters_and_overhead():
    m = make()
    cfg = m.config
    assert summarize(m)["params_design_overhead"] == 2 * L * cfg.d_model * cfg.kv_heads * cfg.head_dim
    w = dict(m.named_parameters())["blocks.2.mlp.depth_k_proj.weight"]
    assert w.shape == (cfg.kv_heads * cfg.head_dim, cfg.d_model) and 0.01 < float(w.detach().std()) < 0.03


@torch.no_grad()
def test_without_depth_slots_it_is_preln():
    """Layer 0 has no depth slots, so its two sublayers equal Pre-LN's on shared weights; later ones differ."""
    m = make()
    pre = build_model(ModelConfig.debug("preln", n_layer=L, n_head=4, n_kv_head=2), seed=3).eval()
    pre.load_state_dict(m.state_dict(), strict=False)
    toks = tokens()
    cm, cp = capture(m, toks, "_out"), capture(pre, toks, "_out")
    for name in ("blocks.0.hook_attn_out", "blocks.0.hook_mlp_out"):
        torch.testing.assert_close(cm[name], cp[name], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(cm["blocks.1.hook_attn_out"], cp["blocks.1.hook_attn_out"])


@pytest.mark.parametrize("rope", ["unrotated", "rotate_ffn", "prerope_keys"])
@torch.no_grad()
def test_every_layer_matches_an_independent_reference(rope):
    """Rebuild each attention output from the layer's input and the depth cache it received.

    rotate_ffn and prerope_keys (the official recipe: depth keys stored before RoPE, read by the rotated
    query) use ONE query for the sequence and the depth part, so `moda_attention_naive` applies as is
    (exactly the 2l valid slots, token-major); both are also re-derived with the NumPy loop reference.
    unrotated: sequence and depth parts use different queries -> NumPy loop reference only.
    Also checks the slot contents: attention K/V of the layer, FFN K/V from N_l2(u).
    """
    m = make(moda_depth_rope=rope)
    toks = tokens()
    cache = capture(m, toks, "_in", "_out")
    states = states_before_layers(m, toks)
    ctx = m.context(T)
    moda = pytest.importorskip("moda") if rope != "unrotated" else None
    for l, blk in enumerate(m.blocks):
        st = states[l]
        assert st["dk"].shape[2] == 2 * l and bool(st["dvalid"].all())
        q, k, v = blk.attn.fn.project(blk.attn.norm(cache[f"blocks.{l}.hook_attn_in"]))
        qr, kr = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)
        o = numpy_moda(qr, kr, v, q if rope == "unrotated" else qr, st["dk"], st["dv"], st["dvalid"])
        if moda is not None:
            flat = lambda x: rearrange(x, "b t s h e -> b h (t s) e")  # noqa: E731
            o_peer = moda.moda_attention_naive(qr, kr, v, flat(st["dk"]), flat(st["dv"]), num_layers=2 * l)
            torch.testing.assert_close(o_peer, o, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(blk.attn.fn.merge(o), cache[f"blocks.{l}.hook_attn_out"], rtol=1e-5, atol=1e-6)
        # what this layer appended: [attn_l, mlp_l]
        nxt = states[l + 1]
        k_slot = kr if rope == "rotate_ffn" else k
        torch.testing.assert_close(nxt["dk"][:, :, 2 * l], rearrange(k_slot, "b h t e -> b t h e"))
        torch.testing.assert_close(nxt["dv"][:, :, 2 * l], rearrange(v, "b h t e -> b t h e"))
        xn = blk.mlp.norm(cache[f"blocks.{l}.hook_mlp_in"])
        kf = rearrange(blk.mlp.depth_k_proj(xn), "b t (h e) -> b h t e", h=2)
        kf = apply_rope(kf, ctx.cos, ctx.sin) if rope == "rotate_ffn" else kf
        torch.testing.assert_close(nxt["dk"][:, :, 2 * l + 1], rearrange(kf, "b h t e -> b t h e"))
        vf = rearrange(blk.mlp.depth_v_proj(xn), "b t (h e) -> b t h e", h=2)
        torch.testing.assert_close(nxt["dv"][:, :, 2 * l + 1], vf)


@torch.no_grad()
def test_readouts_depth_masses_and_labels():
    m = make()
    toks = tokens()
    ctx = m.context(T, record=True)
    keep = torch.ones(B, T)
    keep[:, 4] = 0
    m.run_layers(m.embed(toks, ctx), ctx, keep={1: keep}, unit="attn")
    rec = ctx.record
    assert m.design.depth_mixing(rec, 2 * L) is None and m.depth_mixing(toks) is None
    assert rec["sub0.slot_labels"] == [] and not rec["sub0.depth_mass"].any()
    assert rec["sub6.slot_labels"] == [
        "attn_0",
        "mlp_0",
        "attn_1",
        "mlp_1",
        "attn_2",
        "mlp_2",
    ]  # as AttnRes labels sources
    for l in range(L):
        dm, sm, sink = rec[f"sub{2 * l}.depth_mass"], rec[f"sub{2 * l}.slot_mass"], rec[f"sub{2 * l}.sink_mass"]
        assert dm.shape == sink.shape == (B, T, 4) and sm.shape == (B, T, 4, 2 * l)
        torch.testing.assert_close(sm.sum(-1), dm)
        assert (dm + sink <= 1 + 1e-6).all() and (sink > 0).all()
        torch.testing.assert_close(sink[:, 0] + dm[:, 0], torch.ones(B, 4))  # t = 0 sees only itself as sequence
        assert f"sub{2 * l + 1}.depth_mass" not in rec  # the MLP only writes
    assert (rec["sub4.depth_mass"] > 0).all()
    # attention of layer 1 skipped at t = 4: its slot (index 2) is invalid there, its FFN slot (3) is not
    later = rec["sub6.slot_mass"]
    assert not later[:, 4, :, 2].any() and (later[:, 4, :, 3] > 0).all() and (later[:, 3, :, 2] > 0).all()


# --- interventions ---------------------------------------------------------------------------------------
@torch.no_grad()
def test_prefix_reuse_and_batched_interventions():
    m, toks = make(), tokens()
    ctx = m.context(T)
    mask = lambda pos: torch.ones(B, T).index_fill_(1, torch.tensor(pos), 0)  # noqa: E731
    plans = [{}, {2: mask([3])}, {3: mask([2, 5, 6])}, {2: mask([1]), 4: mask([8])}]
    prefix = m.run_layers(m.embed(toks, ctx), ctx, 0, 2)
    for p in plans:
        torch.testing.assert_close(run(m, toks, prefix, 2, keep=p), run(m, toks, keep=p), rtol=0, atol=0)
    ones = torch.ones(B, T)
    keep = {l: torch.cat([p.get(l, ones) for p in plans]) for l in (2, 3, 4)}
    batched = run(m, toks, state_repeat(prefix, len(plans)), 2, keep=keep)
    torch.testing.assert_close(batched, torch.cat([run(m, toks, keep=p) for p in plans]), rtol=1e-5, atol=1e-6)
    toks2 = tokens(1)
    p2 = m.run_layers(m.embed(toks2, ctx), ctx, 0, 2)
    torch.testing.assert_close(
        run(m, toks, state_cat([prefix, p2]), 2), torch.cat([run(m, toks), run(m, toks2)]), rtol=1e-5, atol=1e-6
    )


@torch.no_grad()
def test_swap_is_positional():
    m, toks = make(), tokens()
    base = run(m, toks)
    for mode in ("body", "all"):
        torch.testing.assert_close(run(m, toks, order=list(range(L)), swap=mode), base, rtol=0, atol=0)
    swapped = make()
    for p in ("attn", "mlp"):  # bodies (incl. the FFN depth projections) exchanged; routers hold nothing
        a, b = getattr(swapped.blocks[1], p), getattr(swapped.blocks[3], p)
        sa = {k: x.clone() for k, x in a.state_dict().items()}
        a.load_state_dict(b.state_dict())
        b.load_state_dict(sa)
    order = [0, 3, 2, 1, 4]
    for mode in ("body", "all"):
        torch.testing.assert_close(run(m, toks, order=order, swap=mode), run(swapped, toks), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_skip_semantics():
    """keep = 0: h' = h and the layer's depth slots vanish on those tokens. Consequences:
    * the result no longer depends on the skipped layer's weights;
    * skipping a layer everywhere == deleting it (L-1 layers, the others' weights unchanged);
    * skipping a zero-output layer (W_o = W_down = 0) is a no-op only for the LAST layer: elsewhere its
      depth slots still feed later layers, and the skip removes them.
    """
    m, toks = make(), tokens()
    keep = {2: torch.zeros(B, T)}
    other = make()
    for p in other.blocks[2].parameters():
        p.normal_(std=0.1)
    torch.testing.assert_close(run(m, toks, keep=keep), run(other, toks, keep=keep), rtol=1e-5, atol=1e-6)
    short = make(n_layer=L - 1)
    sd = {k: x for k, x in m.state_dict().items() if not k.startswith("blocks.")}
    for l_new, l_old in enumerate([0, 1, 3, 4]):
        sd.update({f"blocks.{l_new}.{k}": x for k, x in m.blocks[l_old].state_dict().items()})
    short.load_state_dict(sd)
    torch.testing.assert_close(run(m, toks, keep=keep), run(short, toks), rtol=1e-5, atol=1e-6)
    # per-token skip: the layer update is zero exactly there
    part = torch.ones(B, T).index_fill_(1, torch.tensor([2, 6]), 0)
    upd = {}
    ctx = m.context(T)
    m.run_layers(m.embed(toks, ctx), ctx, keep={2: part}, on_layer=lambda pos, s, u: upd.__setitem__(pos, u))
    assert not upd[2][:, [2, 6]].any() and upd[2][:, [0, 1, 3]].abs().sum() > 0
    for layer in (2, L - 1):
        z = make()
        z.blocks[layer].attn.fn.o_proj.weight.zero_()
        z.blocks[layer].mlp.fn.down_proj.weight.zero_()
        skip = {layer: torch.ones(B, T).index_fill_(1, torch.arange(1, T), 0)}
        same = torch.allclose(run(z, toks, keep=skip), run(z, toks), rtol=1e-6, atol=1e-7)
        assert same == (layer == L - 1)

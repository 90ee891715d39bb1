"""Foundation: shapes, closed forms, an independent NumPy re-derivation, hooks, interventions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from depthlens.models import ModelConfig, build_model
from depthlens.models.residual.base import state_cat, state_repeat, state_select

SINGLE = ["preln", "lns", "sandwich", "deepnorm", "keel"]


def _tokens(cfg: ModelConfig, B: int = 2, T: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T), generator=g)


def _randomize_gains(model, seed: int = 1) -> None:
    """Move every norm gain off 1 so a misplaced norm cannot hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "post_norm" in n or "trunk_norm" in n:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))


# --- independent NumPy re-derivation of the single-stream designs (docs/designs.md#single-stream) ----------


def _np_rms(x, w, eps):
    return w * x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def _np_rope(x, theta):  # x: (T, H, dh), HF rotate_half
    T, _, dh = x.shape
    inv = 1.0 / theta ** (np.arange(0, dh, 2) / dh)
    ang = np.outer(np.arange(T), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    rot = np.concatenate([-x2, x1], -1)
    return x * cos[:, None] + rot * sin[:, None]


def _np_attn(x, p, pre, cfg):  # x: (T, d) single sequence
    T = x.shape[0]
    H, Hk, dh = cfg.n_head, cfg.kv_heads, cfg.head_dim
    q = (x @ p[pre + "q_proj.weight"].T).reshape(T, H, dh)
    k = (x @ p[pre + "k_proj.weight"].T).reshape(T, Hk, dh)
    v = (x @ p[pre + "v_proj.weight"].T).reshape(T, Hk, dh)
    q, k = _np_rope(q, cfg.rope_theta), _np_rope(k, cfg.rope_theta)
    out = np.zeros((T, H, dh))
    for h in range(H):
        g = h // (H // Hk)
        s = q[:, h] @ k[:, g].T / math.sqrt(dh)
        s = s + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out[:, h] = a @ v[:, g]
    return out.reshape(T, H * dh) @ p[pre + "o_proj.weight"].T


def _np_mlp(x, p, pre):
    g = x @ p[pre + "gate_proj.weight"].T
    return ((g / (1 + np.exp(-g))) * (x @ p[pre + "up_proj.weight"].T)) @ p[pre + "down_proj.weight"].T


def _np_forward(model, tokens):
    """Logits of one sequence computed from the designs' equations (docs/designs.md), in float64 NumPy."""
    cfg = model.config
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    eps, L = cfg.norm_eps, cfg.n_layer
    h = p["embed_tokens.weight"][tokens]
    for l in range(L):
        for kind, j in (("attn", 2 * l), ("mlp", 2 * l + 1)):
            pre = f"blocks.{l}.{kind}."
            F = (
                (lambda z: _np_attn(z, p, pre + "fn.", cfg))  # noqa: B023 (called in this iteration)
                if kind == "attn"
                else (lambda z: _np_mlp(z, p, pre + "fn."))  # noqa: B023
            )
            gain = p[pre + "norm.weight"]
            if cfg.arch in ("preln", "lns", "sandwich"):
                scale = 1 / math.sqrt(l + 1) if cfg.arch == "lns" else 1.0
                y = F(_np_rms(h, gain, eps) * scale)
                if cfg.arch == "sandwich":
                    y = _np_rms(y, p[pre + "post_norm.weight"], eps)
                h = h + y
            elif cfg.arch == "deepnorm":
                alpha = (2 * L) ** 0.25
                h = _np_rms(alpha * h + F(h), gain, eps)  # no branch pre-norm; trunk norm
            elif cfg.arch == "keel":
                router = "router_attn" if kind == "attn" else "router_mlp"
                y = F(_np_rms(h, gain, eps))
                if j == 0:
                    h = h + y
                else:
                    alpha = 1.0 if j == 1 else 2 * L
                    h = _np_rms(alpha * h + y, p[f"blocks.{l}.{router}.trunk_norm.weight"], eps)
    return _np_rms(h, p["norm.weight"], eps) @ p["lm_head.weight"].T


@pytest.mark.parametrize("arch", SINGLE)
def test_numpy_rederivation_matches(arch):
    cfg = ModelConfig.debug(arch, n_layer=2, d_model=16, n_head=2, n_kv_head=1, vocab_size=31)
    model = build_model(cfg, seed=3)
    _randomize_gains(model)
    toks = _tokens(cfg, B=1, T=7)
    got = model(toks)[0].double().detach().numpy()
    want = _np_forward(model, toks[0].numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", SINGLE)
def test_forward_shapes_and_counts(arch):
    cfg = ModelConfig.debug(arch)
    model = build_model(cfg)
    toks = _tokens(cfg)
    assert model(toks).shape == (2, 12, cfg.vocab_size)
    extra = {
        "preln": 0,
        "lns": 0,
        "deepnorm": 0,
        "sandwich": 2 * cfg.n_layer * cfg.d_model,
        "keel": (2 * cfg.n_layer - 1) * cfg.d_model,
    }[arch]
    from depthlens.models.summary import summarize

    assert summarize(model)["params_design_overhead"] == extra


def test_lns_equals_preln_with_folded_gains():
    lns = build_model(ModelConfig.debug("lns"), seed=5)
    _randomize_gains(lns)
    pre = build_model(ModelConfig.debug("preln"), seed=0)
    sd = lns.state_dict()
    for l in range(lns.n_layer):
        for kind in ("attn", "mlp"):
            sd[f"blocks.{l}.{kind}.norm.weight"] = sd[f"blocks.{l}.{kind}.norm.weight"] / math.sqrt(l + 1)
    pre.load_state_dict(sd)
    toks = _tokens(lns.config)
    torch.testing.assert_close(lns(toks), pre(toks), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("L", [2, 16, 32, 70])
def test_deepnorm_and_keel_constants(L):
    dn = ModelConfig.debug("deepnorm", n_layer=L).resolved()
    assert dn.deepnorm_alpha == pytest.approx((2 * L) ** 0.25)
    assert dn.deepnorm_beta == pytest.approx((8 * L) ** -0.25)
    table = {16: (2.378, 0.297), 32: (2.828, 0.250), 70: (3.440, 0.206)}  # DeepNorm's (α, β) at L = 16, 32, 70
    if L in table:
        assert dn.deepnorm_alpha == pytest.approx(table[L][0], abs=1e-3)
        assert dn.deepnorm_beta == pytest.approx(table[L][1], abs=1e-3)
    keel = build_model(ModelConfig.debug("keel", n_layer=L, d_model=16, n_head=2))
    alphas = [r.readout().get("alpha") for b in keel.blocks for r in (b.router_attn, b.router_mlp)]
    assert alphas[0] is None and alphas[1] == 1.0 and all(a == 2 * L for a in alphas[2:])
    assert not hasattr(keel.blocks[0].router_attn, "trunk_norm")  # first attention: pure Pre-LN


def test_deepnorm_init_scale():
    cfg = ModelConfig.debug("deepnorm", d_model=64, n_head=4, n_layer=8)
    m = build_model(cfg, seed=0)
    beta = (8 * 8) ** -0.25
    w = m.blocks[0].mlp.fn.up_proj.weight  # xavier normal: std = gain * sqrt(2 / (fan_in + fan_out))
    want = beta * math.sqrt(2 / sum(w.shape))
    assert float(w.detach().std()) == pytest.approx(want, rel=0.1)
    q = m.blocks[0].attn.fn.q_proj.weight
    assert float(q.detach().std()) == pytest.approx(math.sqrt(2 / sum(q.shape)), rel=0.1)


def test_hand_computed_two_layer_identity_case():
    """With all branch outputs zero, Pre-LN logits are lm_head(N_f(E[token])) — by hand."""
    cfg = ModelConfig.debug("preln", n_layer=2, d_model=8, n_head=2, vocab_size=11)
    m = build_model(cfg, seed=0)
    with torch.no_grad():
        for b in m.blocks:
            b.attn.fn.o_proj.weight.zero_()
            b.mlp.fn.down_proj.weight.zero_()
    toks = torch.tensor([[3, 1, 4]])
    e = m.embed_tokens.weight[toks[0]].detach().double()
    want = (e / torch.sqrt((e**2).mean(-1, keepdim=True) + cfg.norm_eps)) @ m.lm_head.weight.detach().double().T
    torch.testing.assert_close(m(toks)[0].double(), want, rtol=1e-5, atol=1e-6)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="'n_head'"):
        ModelConfig(d_model=30, n_head=4)
    with pytest.raises(ValueError, match="'arch'"):
        ModelConfig(arch="postln")
    with pytest.raises(ValueError, match="'n_kv_head'"):
        ModelConfig(n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match="'attnres_block_starts'"):
        ModelConfig(n_layer=4, attnres_block_starts=[1, 2])
    with pytest.raises(ValueError, match="unknown field"):
        ModelConfig.from_dict({"arch": "preln", "bogus": 1})


def test_sequence_longer_than_max_is_refused():
    m = build_model(ModelConfig.debug("preln", max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"order": [0, 0, 2, 3]}, "permutation of range"),
        ({"order": [0, 1, 2]}, "permutation of range"),
        ({"unit": "ffn"}, "unit must be"),
        ({"swap": "some"}, "swap must be"),
    ],
)
def test_run_layers_refuses_bad_arguments(kw, msg):
    """One contract for DepthModel and the adapters (models.protocol.check_run_layers_args): a repeated
    layer in `order` used to run silently on the native model."""
    m = build_model(ModelConfig.debug("preln"))
    toks = torch.zeros(1, 4, dtype=torch.long)
    ctx = m.context(4)
    with pytest.raises(ValueError, match=msg):
        m.run_layers(m.embed(toks, ctx), ctx, **kw)


# --- hooks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", SINGLE)
def test_run_with_cache_has_every_resid_hook_and_leaves_none(arch):
    m = build_model(ModelConfig.debug(arch))
    toks = _tokens(m.config)
    logits, cache = m.run_with_cache(toks)
    for i in range(m.n_layer):
        for site in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
            assert cache[f"blocks.{i}.hook_{site}"].shape == (2, 12, m.config.d_model)
    # resid_post of layer i is resid_pre of layer i+1; the last one is h_L before the final norm
    for i in range(m.n_layer - 1):
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_post"], cache[f"blocks.{i + 1}.hook_resid_pre"])
    torch.testing.assert_close(cache[f"blocks.{m.n_layer - 1}.hook_resid_post"], cache["hook_resid_final"])
    torch.testing.assert_close(logits, m(toks))
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in m.hook_dict.values())


def test_run_with_hooks_edit_changes_output_and_is_removed():
    m = build_model(ModelConfig.debug("preln"))
    toks = _tokens(m.config)
    clean = m(toks)

    def zero_row1(x, hook):
        x = x.clone()
        x[1] = 0
        return x

    edited = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_post", zero_row1)])
    torch.testing.assert_close(edited[0], clean[0])  # other row untouched
    assert not torch.allclose(edited[1], clean[1])
    torch.testing.assert_close(m(toks), clean)  # hook gone
    assert all(not hp.fwd_hooks for hp in m.hook_dict.values())


def test_nnsight_reads_and_edits_layer_output():
    from nnsight import NNsight

    m = build_model(ModelConfig.debug("preln"))
    toks = _tokens(m.config)
    _, cache = m.run_with_cache(toks)
    net = NNsight(m)
    with torch.no_grad(), net.trace(toks):
        h = net.blocks[2].hook_resid_post.output.save()
    torch.testing.assert_close(h, cache["blocks.2.hook_resid_post"])
    # edit: make layer 2 an identity at all positions == skipping it with run_layers
    with torch.no_grad(), net.trace(toks):
        net.blocks[2].hook_resid_post.output = net.blocks[2].hook_resid_pre.output
        out = net.output.save()
    keep = {2: torch.zeros(2, 12)}
    torch.testing.assert_close(out, m(toks, keep=keep), rtol=1e-5, atol=1e-6)
    assert all(not hp.fwd_hooks for hp in m.hook_dict.values())


# --- interventions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", SINGLE)
def test_prefix_reuse_equals_full_run(arch):
    m = build_model(ModelConfig.debug(arch))
    toks = _tokens(m.config)
    ctx = m.context(toks.shape[1])
    with torch.no_grad():
        s0 = m.embed(toks, ctx)
        s2 = m.run_layers(s0, ctx, 0, 2)
        keep = {3: torch.zeros(2, 12)}
        full = m.head(m.run_layers(s0, ctx, keep=keep), ctx)
        reused = m.head(m.run_layers(s2, ctx, 2, keep=keep), ctx)
    torch.testing.assert_close(reused, full)


@pytest.mark.parametrize("arch", SINGLE)
def test_batched_interventions_equal_one_at_a_time(arch):
    m = build_model(ModelConfig.debug(arch))
    toks = _tokens(m.config, B=2)
    ctx = m.context(12)
    with torch.no_grad():
        s1 = m.run_layers(m.embed(toks, ctx), ctx, 0, 1)
        masks = []
        for s in (1, 2, 3):
            k = torch.ones(2, 12)
            k[:, 1 + s :] = 0  # different token sets per intervention; position 0 never skipped
            masks.append((s, k))
        singles = [m.head(m.run_layers(s1, ctx, 1, keep={s: k}), ctx) for s, k in masks]
        # batched: three copies of the batch, each row-block with its own mask
        big = state_repeat(s1, 3)
        keep = {}
        for i, (s, k) in enumerate(masks):
            full = torch.ones(6, 12)
            full[2 * i : 2 * i + 2] = k
            keep[s] = full
        batched = m.head(m.run_layers(big, ctx, 1, keep=keep), ctx)
    for i in range(3):
        torch.testing.assert_close(batched[2 * i : 2 * i + 2], singles[i], rtol=1e-5, atol=1e-6)
    # state helpers: cat/select invert each other
    torch.testing.assert_close(state_select(state_cat([s1, s1]), slice(2, 4))["h"], s1["h"])


@pytest.mark.parametrize("arch", SINGLE)
def test_swap_same_layer_and_zero_layer_skip_are_noops(arch):
    m = build_model(ModelConfig.debug(arch))
    toks = _tokens(m.config)
    clean = m(toks)
    order = list(range(m.n_layer))
    torch.testing.assert_close(m(toks, order=order, swap="body"), clean)
    torch.testing.assert_close(m(toks, order=order, swap="all"), clean)
    with torch.no_grad():
        m.blocks[2].attn.fn.o_proj.weight.zero_()
        m.blocks[2].mlp.fn.down_proj.weight.zero_()
    clean = m(toks)
    if arch in ("preln", "lns", "sandwich"):  # zero branch => identity layer => skip is a no-op
        torch.testing.assert_close(m(toks, keep={2: torch.zeros(2, 12)}), clean)


def test_swap_changes_output_and_body_equals_all_for_preln():
    m = build_model(ModelConfig.debug("preln"), seed=2)
    toks = _tokens(m.config)
    order = [0, 2, 1, 3]
    a = m(toks, order=order, swap="body")
    torch.testing.assert_close(a, m(toks, order=order, swap="all"))
    assert not torch.allclose(a, m(toks))
    # swapping identical layers is a no-op
    m.blocks[2].load_state_dict(m.blocks[1].state_dict())
    torch.testing.assert_close(m(toks, order=order), m(toks))


def test_lns_body_swap_keeps_the_positional_scale():
    m = build_model(ModelConfig.debug("lns"), seed=2)
    toks = _tokens(m.config)
    assert not torch.allclose(m(toks, order=[1, 0, 2, 3], swap="body"), m(toks, order=[1, 0, 2, 3], swap="all"))


def test_depth_mixing_preln_is_lower_triangular_ones():
    m = build_model(ModelConfig.debug("preln", n_layer=2))
    M = m.depth_mixing(_tokens(m.config))
    want = torch.triu(torch.ones(5, 5, dtype=torch.float64))  # M[i, j] = 1 for i <= j
    torch.testing.assert_close(M[0, 3], want)


def test_depth_mixing_deepnorm_matches_recorded_rms_products():
    m = build_model(ModelConfig.debug("deepnorm", n_layer=2), seed=4)
    toks = _tokens(m.config)
    rec = m.readouts(toks)
    M = m.depth_mixing(toks)
    a = (2 * 2) ** 0.25
    r = [rec[f"sub{k}.rms"].double() for k in range(4)]
    # weight of the embedding in x_3 (the input of sublayer 3) = a^3 / (r0 r1 r2); of F_1 (source 2) = a / (r1 r2)
    torch.testing.assert_close(M[..., 0, 3], a**3 / (r[0] * r[1] * r[2]))
    torch.testing.assert_close(M[..., 2, 3], a / (r[1] * r[2]))
    # the recorded rms is the true trunk rms: x_1 = N(a h0 + F) has unit rms before the gain
    assert torch.all(M[..., 3, 2] == 0)

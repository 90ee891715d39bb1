"""The TransformerLens surface of native models: attention, MLP and norm hook points with TransformerLens' names
and shapes, checked against NumPy re-derivations; hooks that leave the forward bit-identical; edits that flow;
ActivationCache helpers; `transformer_lens.patching` against hand-made patches; a checkpoint's tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.models import ModelConfig, build_model

torch.set_num_threads(1)
B, T = 2, 7


def _tokens(vocab: int, seed: int = 0, b: int = B, t: int = T) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _model(arch: str, **kw):
    kw = {"n_layer": 2, "n_kv_head": 2, **kw}  # GQA: 4 query heads read 2 KV heads
    return build_model(ModelConfig.debug(arch, **kw), seed=5).eval()


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- the forward stays bit-identical -----------------------------------------------------------------------


@pytest.mark.parametrize("arch", SLUGS)
def test_hooks_leave_the_forward_bit_identical(arch):
    from depthlens.adapters import Lens, attached_hooks

    m = _model(arch)
    toks = _tokens(m.config.vocab_size)
    with torch.no_grad():
        plain = m(toks)
        logits, cache = Lens(m).run_with_cache(toks)  # every hook point hooked, pattern and scale included
        seen = []
        read = m.run_with_hooks(
            toks,
            fwd_hooks=[(lambda n: n.endswith(("hook_pattern", "hook_scale")), lambda x, hook: seen.append(hook.name))],
        )
    assert torch.equal(logits, plain) and torch.equal(read, plain)
    assert "blocks.1.attn.hook_pattern" in seen and "ln_final.hook_scale" in seen
    assert "blocks.1.attn.hook_pattern" in cache and attached_hooks(m) == []
    # gradients too: a backward through a run whose hooks only read is the plain one
    m.zero_grad()
    m(toks).logsumexp(-1).mean().backward()
    ref = [p.grad for p in m.parameters()]  # None: unused (MoDA's last depth-KV projections)
    m.zero_grad(set_to_none=True)
    m.run_with_hooks(toks, fwd_hooks=[(lambda n: True, lambda x, hook: None)]).logsumexp(-1).mean().backward()
    assert all((a is None and p.grad is None) or torch.equal(a, p.grad) for a, p in zip(ref, m.parameters()))


# --- names, shapes and values --------------------------------------------------------------------------------


def test_hook_names_and_shapes_follow_transformer_lens():
    from transformer_lens.utilities import get_act_name

    m = _model("preln")
    c = m.config
    H, Hkv, dh, f, d = c.n_head, c.kv_heads, c.head_dim, c.ffn_dim, c.d_model
    _, cache = m.run_with_cache(_tokens(c.vocab_size))
    want = {
        ("q", "attn"): (B, T, H, dh),
        ("k", "attn"): (B, T, Hkv, dh),
        ("v", "attn"): (B, T, Hkv, dh),
        ("rot_q", "attn"): (B, T, H, dh),
        ("rot_k", "attn"): (B, T, Hkv, dh),
        ("z", "attn"): (B, T, H, dh),
        ("pattern", "attn"): (B, H, T, T),
        ("attn_scores", "attn"): (B, H, T, T),
        ("pre", "mlp"): (B, T, f),
        ("pre_linear", "mlp"): (B, T, f),
        ("post", "mlp"): (B, T, f),
        ("normalized", "ln1"): (B, T, d),
        ("scale", "ln1"): (B, T, 1),
        ("normalized", "ln2"): (B, T, d),
        ("scale", "ln2"): (B, T, 1),
    }
    for (name, kind), shape in want.items():
        key = get_act_name(name, 1, kind)
        assert tuple(cache[key].shape) == shape, key
    assert tuple(cache["ln_final.hook_normalized"].shape) == (B, T, d)
    assert tuple(cache["ln_final.hook_scale"].shape) == (B, T, 1)


def test_attention_mlp_and_norm_hooks_match_numpy():
    """Every hooked value re-derived in float64 NumPy from the weights and the cached inputs."""
    m = _model("preln")
    c = m.config
    H, Hkv, dh, eps = c.n_head, c.kv_heads, c.head_dim, c.norm_eps
    G = H // Hkv
    with torch.no_grad():
        logits, cache = m.run_with_cache(_tokens(c.vocab_size, 1))
    blk = m.blocks[1]
    att = blk.attn.fn
    x = _np(cache["blocks.1.hook_resid_pre"])
    scale = np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    np.testing.assert_allclose(_np(cache["blocks.1.ln1.hook_scale"]), scale, rtol=1e-6)
    np.testing.assert_allclose(_np(cache["blocks.1.ln1.hook_normalized"]), x / scale, atol=1e-6)
    xn = x / scale * _np(blk.attn.norm.weight)
    q = (xn @ _np(att.q_proj.weight).T).reshape(B, T, H, dh)
    v = (xn @ _np(att.v_proj.weight).T).reshape(B, T, Hkv, dh)
    np.testing.assert_allclose(_np(cache["blocks.1.attn.hook_q"]), q, atol=1e-5)
    np.testing.assert_allclose(_np(cache["blocks.1.attn.hook_v"]), v, atol=1e-5)
    # RoPE (HF rotate-half layout) at position t with frequencies theta^(-2i/dh)
    inv = c.rope_theta ** (-np.arange(0, dh, 2) / dh)
    ang = np.arange(T)[:, None] * np.concatenate([inv, inv])[None]  # (T, dh)

    def rot(a):
        return (
            a * np.cos(ang)[None, :, None]
            + np.concatenate([-a[..., dh // 2 :], a[..., : dh // 2]], -1) * np.sin(ang)[None, :, None]
        )

    qr, kr = rot(q), rot(_np(cache["blocks.1.attn.hook_k"]))
    np.testing.assert_allclose(_np(cache["blocks.1.attn.hook_rot_q"]), qr, atol=1e-5)
    # the pattern: softmax(q k^T / sqrt(dh) + causal mask), query head h reading KV head h // G
    kh = np.repeat(kr, G, axis=2)  # (B, T, H, dh)
    scores = np.einsum("bqhe,bkhe->bhqk", qr, kh) / np.sqrt(dh)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    pattern = _softmax(scores)
    np.testing.assert_allclose(_np(cache["blocks.1.attn.hook_attn_scores"]), scores, atol=1e-5)
    np.testing.assert_allclose(_np(cache["blocks.1.attn.hook_pattern"]), pattern, atol=1e-6)
    # pattern @ V reproduces hook_z (the fused kernel's output), and W_O of z is the branch output
    z = np.einsum("bhqk,bkhe->bqhe", _np(cache["blocks.1.attn.hook_pattern"]), np.repeat(v, G, axis=2))
    np.testing.assert_allclose(_np(cache["blocks.1.attn.hook_z"]), z, atol=1e-5)
    np.testing.assert_allclose(
        _np(cache["blocks.1.hook_attn_out"]), z.reshape(B, T, H * dh) @ _np(att.o_proj.weight).T, atol=1e-5
    )
    # SwiGLU: post = silu(pre) * pre_linear, out = post W_down
    mlp = blk.mlp.fn
    hn = _rms(_np(cache["blocks.1.hook_resid_mid"]), eps) * _np(blk.mlp.norm.weight)
    pre, lin = hn @ _np(mlp.gate_proj.weight).T, hn @ _np(mlp.up_proj.weight).T
    post = pre / (1 + np.exp(-pre)) * lin
    np.testing.assert_allclose(_np(cache["blocks.1.mlp.hook_pre"]), pre, atol=1e-5)
    np.testing.assert_allclose(_np(cache["blocks.1.mlp.hook_post"]), post, atol=1e-5)
    np.testing.assert_allclose(_np(cache["blocks.1.hook_mlp_out"]), post @ _np(mlp.down_proj.weight).T, atol=1e-5)
    # the final norm: ln_final.hook_normalized W_U (gain folded) gives the logits
    hL = _np(cache["hook_resid_final"])
    np.testing.assert_allclose(_np(cache["ln_final.hook_normalized"]), _rms(hL, eps), atol=1e-6)
    np.testing.assert_allclose(_rms(hL, eps) * _np(m.norm.weight) @ _np(m.lm_head.weight).T, _np(logits), atol=1e-5)


@pytest.mark.parametrize("arch", ["moda", "hc"])
def test_pattern_of_the_other_bodies(arch):
    """MoDA: hook_pattern is the sequence part of its joint softmax (rows + depth mass = 1, column 0 = the sink
    mass its readouts report); HC: the branch reads hook_attn_in, and the pattern is softmax of the scores."""
    m = _model(arch)
    toks = _tokens(m.config.vocab_size, 2)
    with torch.no_grad():
        _, cache = m.run_with_cache(toks)
        rec = m.readouts(toks)
    p = _np(cache["blocks.1.attn.hook_pattern"])  # (B, H, T, T)
    assert np.all(np.triu(p, 1) == 0)
    if arch == "moda":
        depth = _np(rec["sub2.depth_mass"]).transpose(0, 2, 1)  # (B, H, T)
        np.testing.assert_allclose(p.sum(-1) + depth, 1.0, atol=1e-6)
        np.testing.assert_allclose(p[..., 0], _np(rec["sub2.sink_mass"]).transpose(0, 2, 1), atol=1e-7)
        assert depth[..., 1:].min() > 0  # layer 1 has depth slots, so the sequence rows do not sum to 1
    else:
        np.testing.assert_allclose(p, _softmax(_np(cache["blocks.1.attn.hook_attn_scores"])), atol=1e-6)
        np.testing.assert_allclose(
            _np(cache["blocks.1.ln1.hook_normalized"]),
            _rms(_np(cache["blocks.1.hook_attn_in"]), m.config.norm_eps),
            atol=1e-6,
        )


def test_hooks_follow_the_layer_position_under_a_swap():
    """order=[1, 0]: position 0 runs layer 1's body, and blocks.0.* hooks see it (q from layer 1's weights)."""
    m = _model("preln")
    c = m.config
    toks = _tokens(c.vocab_size, 8)
    with torch.no_grad():
        _, cache = m.run_with_cache(toks, order=[1, 0])
        body = m.blocks[1].attn
        q = body.fn.q_proj(cache["blocks.0.ln1.hook_normalized"] * body.norm.weight).view(B, T, c.n_head, c.head_dim)
    torch.testing.assert_close(cache["blocks.0.attn.hook_q"], q, rtol=0, atol=1e-6)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], cache["hook_embed"])


# --- edits flow through --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["preln", "hc", "moda"])
def test_an_edited_pattern_is_what_the_layer_uses(arch):
    """Move head 1's attention at query 5 onto key 2 (in place, as TransformerLens' patch setters do); the same
    edit made by hand on hook_z (z[5, head 1] = v[2, kv head 0], plus MoDA's depth part) gives the same logits."""
    m = _model(arch)
    toks = _tokens(m.config.vocab_size, 3)
    G = m.config.n_head // m.config.kv_heads
    with torch.no_grad():
        _, cache = m.run_with_cache(toks)

        def one_hot(p, hook):
            p[:, 1, 5, :] = 0.0
            p[:, 1, 5, 2] = 1.0

        edited = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_pattern", one_hot)])
        seq = torch.einsum(
            "bhk,bkhe->bhe",
            cache["blocks.1.attn.hook_pattern"][:, 1:2, 5],
            cache["blocks.1.attn.hook_v"][:, :, 1 // G : 1 // G + 1],
        )  # this head's sequence part
        depth = cache["blocks.1.attn.hook_z"][:, 5, 1] - seq[:, 0]  # MoDA's depth slots (0 elsewhere)

        def by_hand(z, hook):
            z = z.clone()
            z[:, 5, 1] = cache["blocks.1.attn.hook_v"][:, 2, 1 // G] + depth
            return z

        manual = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", by_hand)])
        plain = m(toks)
    torch.testing.assert_close(edited, manual, rtol=0, atol=1e-5)
    assert (edited - plain).abs().max() > 1e-3


def test_a_backward_hook_on_the_pattern_gets_its_gradient():
    """With a backward hook the layer computes attention from the pattern, so the gradient reaches it: by the
    chain rule through z = pattern @ V, dL/dpattern[h, q, k] = dL/dz[q, h] . v[k, h // G]."""
    m = _model("preln")
    toks = _tokens(m.config.vocab_size, 7)
    G = m.config.n_head // m.config.kv_heads
    grads, acts = {}, {}

    def keep_grad(g, hook):
        grads[hook.name] = g.detach().clone()

    def keep_act(x, hook):
        acts[hook.name] = x.detach().clone()

    names = ("blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z")
    with m.hooks(fwd_hooks=[("blocks.1.attn.hook_v", keep_act)], bwd_hooks=[(n, keep_grad) for n in names]):
        logits = m(toks)
        logits.logsumexp(-1).mean().backward()
    with torch.no_grad():
        torch.testing.assert_close(logits, m(toks), rtol=0, atol=1e-5)  # the explicit path, equal up to rounding
    v = acts["blocks.1.attn.hook_v"].repeat_interleave(G, dim=2)  # (B, T, H, dh)
    expect = torch.einsum("bqhe,bkhe->bhqk", grads["blocks.1.attn.hook_z"], v)
    torch.testing.assert_close(grads["blocks.1.attn.hook_pattern"], expect, rtol=1e-4, atol=1e-7)
    assert expect.abs().max() > 1e-4


def test_an_edited_scale_divides_the_norm_input():
    m = _model("preln")
    toks = _tokens(m.config.vocab_size, 4)
    with torch.no_grad():
        doubled = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.ln2.hook_normalized", lambda x, hook: x / 2)])
        via_scale = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.ln2.hook_scale", lambda s, hook: s * 2)])
        plain = m(toks)
    torch.testing.assert_close(via_scale, doubled, rtol=0, atol=1e-5)
    assert (via_scale - plain).abs().max() > 1e-3


# --- ActivationCache helpers ---------------------------------------------------------------------------------


def test_activation_cache_helpers_on_a_pre_ln_model():
    from depthlens.adapters import Lens

    m = _model("preln")
    lens = Lens(m)
    c = m.config
    L, eps = c.n_layer, c.norm_eps
    with torch.no_grad():
        logits, cache = lens.run_with_cache(_tokens(c.vocab_size, 5))
        # logit lens: the last accumulated residual through ln_final, then W_U, is the model's logits
        acc = cache.accumulated_resid(apply_ln=True)  # (L+1, B, T, d)
        torch.testing.assert_close(acc[-1] @ m.lm_head.weight.T, logits, rtol=0, atol=1e-5)
        np.testing.assert_allclose(_np(acc[0]), _rms(_np(cache["hook_embed"]), eps) * _np(m.norm.weight), atol=1e-6)
        # the decomposition sums to the residual; LN-scaled by ln1's cached scale it sums to ln1's normalized input
        parts, labels = cache.decompose_resid(layer=1, return_labels=True)
        assert labels == ["embed", "0_attn_out", "0_mlp_out"]
        torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_pre"], rtol=0, atol=1e-6)
        scaled = cache.decompose_resid(layer=1, apply_ln=True)
        torch.testing.assert_close(scaled.sum(0), cache["blocks.1.ln1.hook_normalized"], rtol=0, atol=1e-6)
        final = cache.decompose_resid(apply_ln=True).sum(0)  # the final norm's cached scale
        torch.testing.assert_close(final, cache["ln_final.hook_normalized"], rtol=0, atol=1e-6)
    assert cache.stack_activation("pattern").shape == (L, B, c.n_head, T, T)
    assert cache.stack_activation("post").shape == (L, B, T, c.ffn_dim)


@pytest.mark.parametrize(
    "arch, refused",
    [
        ("hc", "ln1 normalises the branch input"),
        ("full_attnres", "the final norm reads h_L"),
        ("deepnorm", "ln1 normalises the branch input"),
    ],
)
def test_ln_scaled_stacks_refuse_where_the_norm_does_not_read_the_residual(arch, refused):
    from depthlens.adapters import Lens

    m = _model(arch)
    with torch.no_grad():
        logits, cache = Lens(m).run_with_cache(_tokens(m.config.vocab_size, 6))
    layer = m.n_layer if arch == "full_attnres" else 1
    with pytest.raises(ValueError, match=refused):
        cache.accumulated_resid(layer=layer, apply_ln=True)
    with pytest.raises(ValueError, match=refused):
        cache.decompose_resid(layer=layer, apply_ln=True)
    assert cache.accumulated_resid(layer=1).shape[0] == 2  # without the norm it stays available
    if arch == "hc":  # the sum collapse makes h_L the stream sum: the logit lens holds at the end
        acc = cache.accumulated_resid(apply_ln=True)
        torch.testing.assert_close(acc[-1] @ m.lm_head.weight.T, logits, rtol=0, atol=1e-5)


# --- transformer_lens.patching on a native checkpoint ---------------------------------------------------------


@pytest.fixture(scope="module", params=["preln", "hc"])
def saved(request, tmp_path_factory):
    """A 2-layer GQA checkpoint with a byte tokenizer, opened by path."""
    import depthlens
    from depthlens.adapters import Lens

    path = tmp_path_factory.mktemp("ckpt") / f"{request.param}_l2"
    m = _model(request.param, vocab_size=257)
    depthlens.save(m, path, extra_files={"tokenizer_config.json": json.dumps({"kind": "bytes"})})
    return Lens.from_pretrained(path)


def test_patching_attention_heads_matches_hand_made_patches(saved):
    from transformer_lens import patching

    from depthlens.adapters import attached_hooks

    lens = saved
    m = lens.model
    c = m.config
    G, dh = c.n_head // c.kv_heads, c.head_dim
    clean, corrupt = lens.to_tokens(["a cat", "the dog"], prepend_bos=True)[:, :5].chunk(2)
    target = int(clean[0, -1])

    def metric(logits):
        return logits[0, -1].log_softmax(-1)[target]

    _, clean_cache = lens.run_with_cache(clean)
    with torch.no_grad():
        _, bad = lens.run_with_cache(corrupt)
    layer, head, pos = 1, 3, 4
    # the pattern of one (layer, head, destination) from the clean run: z there = clean pattern row @ corrupt v
    res = patching.get_act_patch_attn_head_pattern_by_pos(lens, corrupt, clean_cache, metric)
    assert res.shape == (c.n_layer, c.n_head, 5)
    z = _np(clean_cache["pattern", layer][0, head, pos]) @ _np(bad["v", layer][0, :, head // G])  # (d_head,)

    def put_z(x, hook):
        x = x.clone()
        x[0, pos, head] = torch.as_tensor(z, dtype=x.dtype)
        return x

    with torch.no_grad():
        manual = metric(m.run_with_hooks(corrupt, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", put_z)]))
        baseline = metric(m(corrupt))
    assert res[layer, head, pos].item() == pytest.approx(manual.item(), abs=1e-5)
    assert abs(manual.item() - baseline.item()) > 1e-4  # the patch changes something
    # one head's output at one position: the branch output moves by W_O restricted to that head
    res = patching.get_act_patch_attn_head_out_by_pos(lens, corrupt, clean_cache, metric)
    assert res.shape == (c.n_layer, 5, c.n_head)
    dz = _np(clean_cache["z", layer][0, pos, head]) - _np(bad["z", layer][0, pos, head])
    w_o = _np(m.blocks[layer].attn.fn.o_proj.weight)[:, head * dh : (head + 1) * dh]  # (d, dh)

    def put_out(x, hook):
        x = x.clone()
        x[0, pos] += torch.as_tensor(w_o @ dz, dtype=x.dtype)
        return x

    with torch.no_grad():
        manual = metric(m.run_with_hooks(corrupt, fwd_hooks=[(f"blocks.{layer}.hook_attn_out", put_out)]))
    assert res[layer, pos, head].item() == pytest.approx(manual.item(), abs=1e-5)
    assert abs(manual.item() - baseline.item()) > 1e-4
    assert attached_hooks(m) == []


# --- a checkpoint carries its tokenizer ----------------------------------------------------------------------


def test_a_loaded_checkpoint_carries_its_tokenizer(tmp_path):
    import depthlens
    from depthlens.adapters import Lens
    from depthlens.data.tokenizers import ByteTokenizer
    from depthlens.errors import CheckpointError

    ck = depthlens.load("checkpoints/hc_l4")
    assert isinstance(ck.tokenizer, ByteTokenizer) and ck.model.tokenizer is ck.tokenizer
    lens = Lens(ck.model)
    toks = lens.to_tokens(["hi", "héllo"])
    assert toks.tolist()[0][:3] == [256, 104, 105] and lens.to_string(toks[1]) == "héllo"
    assert lens.to_string(toks[0, :3].tolist()) == "hi"
    with torch.no_grad():
        logits, _ = Lens.from_pretrained("checkpoints/hc_l4").run_with_cache(toks)
        assert torch.equal(logits, ck.model(toks))
    # a tokenizer whose ids do not fit the embedding is refused, not silently used
    m = build_model(ModelConfig.debug("preln", n_layer=1))  # vocab 97
    depthlens.save(m, tmp_path / "small", extra_files={"tokenizer_config.json": json.dumps({"kind": "bytes"})})
    with pytest.raises(CheckpointError, match="257 ids, the model's embedding only 97"):
        depthlens.load(tmp_path / "small")
    depthlens.save(m, tmp_path / "none")
    assert depthlens.load(tmp_path / "none").model.tokenizer is None
    with pytest.raises(ValueError, match="no tokenizer"):
        Lens.from_pretrained(tmp_path / "none").to_string([1, 2])

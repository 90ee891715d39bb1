"""Full and Block AttnRes (docs/designs.md#attnres, docs/concepts.md)."""

from __future__ import annotations

import math

import pytest
import torch

from depthlens.models import ModelConfig, build_model
from depthlens.models.residual.attnres import AttnResOperator
from depthlens.models.residual.base import state_cat, state_repeat
from depthlens.models.summary import summarize
from shared_weights import share_attnres_trunk

ARCHS = ["full_attnres", "block_attnres"]
STARTS = [0, 2, 5]  # irregular Block AttnRes boundaries for L = 6: blocks of 2, 3, 1 layers


def make(arch: str, seed: int = 0, **kw) -> torch.nn.Module:
    base = dict(n_layer=6, attnres_block_starts=STARTS if arch == "block_attnres" else None)
    base.update(kw)
    return build_model(ModelConfig.debug(arch, **base), seed=seed).eval()


def randomize_queries(model, scale: float = 1.0, seed: int = 1) -> None:
    """Random pseudo-queries w and key gains gamma on every operator (they are 0 and 1 at init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for op in [m for m in model.modules() if isinstance(m, AttnResOperator)]:
            op.pseudo_query.copy_(scale * torch.randn(op.pseudo_query.shape, generator=g))
            op.key_norm.weight.copy_(1 + 0.3 * torch.randn(op.key_norm.weight.shape, generator=g))


def tokens(B: int = 2, T: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


def capture(model, toks, *suffixes: str, **run_kw) -> dict[str, torch.Tensor]:
    _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith(suffixes), **run_kw)
    return cache


def branch_inputs(cache, L: int) -> list[torch.Tensor]:
    return [cache[f"blocks.{j // 2}.hook_{'attn' if j % 2 == 0 else 'mlp'}_in"] for j in range(2 * L)]


def branch_outputs(cache, L: int) -> list[torch.Tensor]:
    return [cache[f"blocks.{j // 2}.hook_{'attn' if j % 2 == 0 else 'mlp'}_out"] for j in range(2 * L)]


# --- configuration -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "L, sizes",
    [
        (16, [2] * 8),
        (20, [3] * 6 + [2]),
        (24, [3] * 8),
        (28, [4] * 7),
        (32, [4] * 8),
        (42, [6] * 7),
        (70, [9] * 7 + [7]),
    ],
)
def test_block_boundaries_follow_the_kimi_k3_table(L, sizes):
    starts = ModelConfig(arch="block_attnres", n_layer=L, d_model=64, n_head=4).block_starts
    assert [b - a for a, b in zip(starts, starts[1:] + [L])] == sizes


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_overhead_is_4L_plus_2_times_d(arch):
    m = make(arch)
    assert summarize(m)["params_design_overhead"] == (4 * 6 + 2) * m.config.d_model
    names = dict(m.named_parameters())
    assert not names["blocks.3.router_mlp.pseudo_query"].any()  # w = 0 at init (mandatory)
    assert (names["final_router.key_norm.weight"] == 1).all()


# --- the operator --------------------------------------------------------------------------------------
def test_operator_equations_and_fp32():
    torch.manual_seed(0)
    op = AttnResOperator(8, eps=1e-6)
    randomize_queries(op)
    v = torch.randn(2, 3, 4, 8) * torch.tensor([0.1, 1.0, 10.0, 3.0])[:, None]  # (B, T, S, d)
    x, alpha, logits = op.mix(v.bfloat16())
    assert alpha.dtype == logits.dtype == torch.float32 and x.dtype == torch.bfloat16
    x, alpha, logits = op.mix(v)
    k = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)  # keys: weightless RMS, no 1/sqrt(d)
    ref_logits = (k * (op.key_norm.weight * op.pseudo_query)).sum(-1)
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(x, (ref_logits.softmax(-1)[..., None] * v).sum(2))  # RAW values mixed
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 3))


def test_operator_huge_logit_and_masking():
    op = AttnResOperator(4, eps=1e-6)
    with torch.no_grad():
        op.pseudo_query.copy_(torch.tensor([0.0, 0.0, 0.0, 1e4]))
    v = torch.zeros(1, 1, 3, 4)
    v[..., 0, 0], v[..., 1, 1], v[..., 2, 3] = 1.0, 2.0, 0.5  # only the last source is along w
    x, alpha, _ = op.mix(v)
    assert alpha[0, 0, -1] == 1.0
    torch.testing.assert_close(x, v[:, :, -1])
    x, alpha, logits = op.mix(v, valid=torch.tensor([[[True, True, False]]]))
    assert alpha[0, 0, -1] == 0 and logits[0, 0, -1] == float("-inf")
    torch.testing.assert_close(alpha[0, 0, :2], torch.full((2,), 0.5))


def test_operator_matches_attn_res_package():
    attn_res = pytest.importorskip("attn_res")
    torch.manual_seed(0)
    ours = AttnResOperator(16, eps=1e-6)
    randomize_queries(ours)
    theirs = attn_res.AttnResOperator(16, eps=1e-6)
    with torch.no_grad():
        theirs.pseudo_query.copy_(ours.key_norm.weight * ours.pseudo_query)  # its key norm is weightless
    v = torch.randn(2, 5, 7, 16) * torch.rand(1, 1, 7, 1) * 3  # (B, T, S, d)
    x, _, _ = ours.mix(v)
    torch.testing.assert_close(x, theirs(v.permute(2, 0, 1, 3)), rtol=1e-6, atol=1e-6)


# --- init: AttnRes with w = 0 is Pre-LN ---------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_zero_queries_give_uniform_weights_and_preln_directions(arch):
    # eps -> 0: RMSNorm(x / S) = RMSNorm(x) only up to eps, and the debug residual is small (~1e-2)
    m = make(arch, norm_eps=1e-12)
    pre = build_model(ModelConfig.debug("preln", n_layer=6, norm_eps=1e-12), seed=5).eval()
    missing, _ = pre.load_state_dict(m.state_dict(), strict=False)  # share every backbone weight
    assert not missing
    toks = tokens()
    ca, cp = (capture(x, toks, "_in", "resid_final") for x in (m, pre))
    cos = torch.nn.functional.cosine_similarity
    for xa, xp in zip(branch_inputs(ca, 6) + [ca["hook_resid_final"]], branch_inputs(cp, 6) + [cp["hook_resid_final"]]):
        assert cos(xa, xp, dim=-1).min() > 0.99999
    rec = m.readouts(toks)
    for key in [f"sub{j}.alpha" for j in range(12)] + ["final.alpha"]:
        a = rec[key]
        torch.testing.assert_close(a, torch.full_like(a, 1 / a.shape[-1]))


# --- shared-weight cross-check of the whole trunk against kyegomez/attn-res -----------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_trunk_matches_attn_res_package(arch):
    attn_res = pytest.importorskip("attn_res")
    L, S = 6, 2
    m = make(arch, n_head=4, n_kv_head=2, d_ff=96, attnres_block_starts=[0, 2, 4] if arch == "block_attnres" else None)
    randomize_queries(m)
    mode = attn_res.AttnResMode.BLOCK if arch == "block_attnres" else attn_res.AttnResMode.FULL
    tc = attn_res.TransformerConfig(
        d_model=32,
        n_layers=2 * L,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=97,
        max_seq_len=64,
        ffn_mult=3.0,
        attn_res_mode=mode,
        n_blocks=L // S,
        eps=1e-6,
    )
    ref = attn_res.AttnResTransformer(tc).eval()
    assert tc.d_ff == m.config.d_ff and (mode is attn_res.AttnResMode.FULL or tc.block_size == 2 * S)
    share_attnres_trunk(m, ref, into="peer")
    got: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: got.append(out)) for layer in ref.layers]
    hooks.append(ref.out_norm.register_forward_pre_hook(lambda mod, args: got.append(args[0])))
    toks = tokens()
    with torch.no_grad():
        ref(toks)
    for h in hooks:
        h.remove()
    cache = capture(m, toks, "_out", f"blocks.{L - 1}.hook_resid_post")
    # every sublayer output, then the trunk output (its final op is a plain sum = our virtual residual)
    for ours, theirs in zip(branch_outputs(cache, L) + [cache[f"blocks.{L - 1}.hook_resid_post"]], got, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=2e-7)


# --- readouts ------------------------------------------------------------------------------------------
def test_block_source_labels_and_self_weight_definition():
    m = make("block_attnres")
    randomize_queries(m)
    rec = m.readouts(tokens())
    expect = {
        0: ["emb"],
        1: ["emb", "partial"],
        2: ["emb", "partial"],
        3: ["emb", "partial"],
        4: ["emb", "block_1"],
        5: ["emb", "block_1", "partial"],
        9: ["emb", "block_1", "partial"],
        10: ["emb", "block_1", "block_2"],
        11: ["emb", "block_1", "block_2", "partial"],
        "final": ["emb", "block_1", "block_2", "partial"],
    }
    for j, labels in expect.items():
        key = "final" if j == "final" else f"sub{j}"
        assert rec[f"{key}.source_labels"] == labels
        a, s = rec[f"{key}.alpha"], rec[f"{key}.self_weight"]
        torch.testing.assert_close(a.sum(-1), torch.ones_like(s))
        torch.testing.assert_close(rec[f"{key}.embedding_weight"], a[..., 0])
        assert rec[f"{key}.source_rms"].shape == (len(labels),)
        if key != "final" and j % 2 == 0 and j // 2 in STARTS:  # block-start attention: last source not own
            assert s.isnan().all()
        else:
            torch.testing.assert_close(s, a[..., -1])
    st = m.readouts(tokens())["static.sub3.query_norm"]
    assert st == pytest.approx(float(m.blocks[1].router_mlp.pseudo_query.detach().norm()))


def test_full_source_labels_and_self_weight_definition():
    m = make("full_attnres")
    randomize_queries(m)
    rec = m.readouts(tokens())
    assert rec["sub0.source_labels"] == ["emb"] and rec["sub0.self_weight"].isnan().all()
    assert rec["sub3.source_labels"] == ["emb", "attn_0", "mlp_0", "attn_1"]
    assert rec["final.source_labels"][-1] == "mlp_5" and len(rec["final.source_labels"]) == 13
    for j in range(1, 12):
        torch.testing.assert_close(rec[f"sub{j}.self_weight"], rec[f"sub{j}.alpha"][..., -1])
        torch.testing.assert_close(rec[f"sub{j}.alpha"].sum(-1), torch.ones(2, 10))


@pytest.mark.parametrize("arch", ARCHS)
def test_huge_logit_on_the_partial_gives_self_weight_one(arch):
    # embedding lives in dims [:16] (positive), every sublayer writes only dims [16:]; w = -50 on [:16]
    m = make(arch)
    with torch.no_grad():
        m.embed_tokens.weight[:, 16:] = 0
        m.embed_tokens.weight[:, :16] = m.embed_tokens.weight[:, :16].abs() + 1
        for blk in m.blocks:
            blk.attn.fn.o_proj.weight[:16] = 0
            blk.mlp.fn.down_proj.weight[:16] = 0
        m.blocks[0].router_mlp.pseudo_query[:16] = -50.0
    s = m.readouts(tokens())["sub1.self_weight"]  # MLP of layer 0: sources [emb, own attention]
    assert (s > 1 - 1e-6).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_depth_mixing_reconstructs_every_branch_input(arch):
    m = make(arch)
    randomize_queries(m)
    toks = tokens()
    M = m.depth_mixing(toks)  # (B, T, 13, 13)
    cache = capture(m, toks, "_in", "_out", "hook_embed", "resid_final")
    src = torch.stack([cache["hook_embed"]] + branch_outputs(cache, 6), 2).double()  # (B, T, 13, d)
    for j, x in enumerate(branch_inputs(cache, 6) + [cache["hook_resid_final"]]):
        torch.testing.assert_close(torch.einsum("bti,btid->btd", M[..., :, j], src).float(), x, rtol=1e-5, atol=1e-6)
    assert not M.tril(-1).any()  # M[i, j] = 0 for i > j (source i is the output of sublayer i-1)
    if arch == "full_attnres":
        torch.testing.assert_close(M.sum(-2), torch.ones(2, 10, 13, dtype=torch.float64), rtol=0, atol=1e-6)


# --- interventions ---------------------------------------------------------------------------------------
VARIANTS = [("full_attnres", "mask"), ("full_attnres", "zero_value"), ("block_attnres", "mask")]


def variant(arch: str, skip: str, seed: int = 0):
    m = make(arch, seed=seed, attnres_skip=skip)
    randomize_queries(m)
    return m


def run(m, toks, start_state=None, start: int = 0, **kw) -> torch.Tensor:
    ctx = m.context(toks.shape[1])
    state = m.embed(toks, ctx) if start_state is None else start_state
    return m.head(m.run_layers(state, ctx, start, **kw), ctx)


def skip_mask(B: int, T: int, positions) -> torch.Tensor:
    k = torch.ones(B, T)
    k[:, positions] = 0
    return k


@pytest.mark.parametrize("arch, skip", VARIANTS)
@torch.no_grad()
def test_prefix_reuse_equals_full_run(arch, skip):
    m, toks = variant(arch, skip), tokens()
    keep = {4: skip_mask(2, 10, [3, 7])}
    ctx = m.context(10)
    prefix = m.run_layers(m.embed(toks, ctx), ctx, 0, 3)
    torch.testing.assert_close(run(m, toks, prefix, 3, keep=keep), run(m, toks, keep=keep), rtol=0, atol=0)


@pytest.mark.parametrize("arch, skip", VARIANTS)
@torch.no_grad()
def test_batched_interventions_equal_one_at_a_time(arch, skip):
    m, toks = variant(arch, skip), tokens()
    B, T = toks.shape
    ones = torch.ones(B, T)
    plans = [
        {},
        {2: skip_mask(B, T, [4])},
        {3: skip_mask(B, T, slice(2, None))},
        {2: skip_mask(B, T, [1, 5]), 5: skip_mask(B, T, [6])},
    ]
    ctx = m.context(T)
    prefix = m.run_layers(m.embed(toks, ctx), ctx, 0, 2)
    batched_keep = {l: torch.cat([p.get(l, ones) for p in plans]) for l in (2, 3, 5)}
    batched = run(m, toks, state_repeat(prefix, len(plans)), 2, keep=batched_keep)
    singles = torch.cat([run(m, toks, keep=p) for p in plans])
    torch.testing.assert_close(batched, singles, rtol=1e-5, atol=1e-6)
    # state_cat of distinct prefixes (two token batches) also batches exactly
    toks2 = tokens(seed=1)
    p2 = m.run_layers(m.embed(toks2, ctx), ctx, 0, 2)
    torch.testing.assert_close(
        run(m, toks, state_cat([prefix, p2]), 2), torch.cat([run(m, toks), run(m, toks2)]), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_swap_is_positional(arch):
    """swap(i, i) is a no-op; swap(i, j) equals exchanging the weights (bodies, or bodies + routers)."""
    m, toks = variant(arch, "mask"), tokens()
    base = run(m, toks)
    for mode in ("body", "all"):
        torch.testing.assert_close(run(m, toks, order=list(range(6)), swap=mode), base, rtol=0, atol=0)
        order = [0, 4, 2, 3, 1, 5]  # 1 <-> 4 crosses a Block AttnRes boundary
        swapped = variant(arch, "mask")
        parts = ("attn", "mlp") + (("router_attn", "router_mlp") if mode == "all" else ())
        for p in parts:
            a, b = getattr(swapped.blocks[1], p), getattr(swapped.blocks[4], p)
            sa = {k: v.clone() for k, v in a.state_dict().items()}
            a.load_state_dict(b.state_dict())
            b.load_state_dict(sa)
        torch.testing.assert_close(run(m, toks, order=order, swap=mode), run(swapped, toks), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(run(m, toks, order=order, swap="body"), run(m, toks, order=order, swap="all"))


def zero_layer_output(m, layer: int) -> None:
    with torch.no_grad():
        m.blocks[layer].attn.fn.o_proj.weight.zero_()
        m.blocks[layer].mlp.fn.down_proj.weight.zero_()


@pytest.mark.parametrize("arch, skip", VARIANTS)
@torch.no_grad()
def test_skip_drops_the_layer_and_zero_output_semantics(arch, skip):
    toks = tokens()
    keep = {2: torch.zeros(2, 10)}  # every token, so no later token can read layer 2 through attention
    m = variant(arch, skip)
    other = variant(arch, skip)
    with torch.no_grad():  # same model except layer 2's body
        for p in other.blocks[2].parameters():
            p.normal_(std=0.1)
    # whatever the mode, a skipped layer's writes are gone: the result does not depend on its weights
    torch.testing.assert_close(run(m, toks, keep=keep), run(other, toks, keep=keep), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(run(m, toks), run(other, toks))
    # skipping a zero-output layer: a no-op for Block AttnRes and Full "zero_value" (v := 0 is what the
    # layer wrote anyway), NOT for Full "mask", where removing the (zero) sources renormalises alpha
    zero_layer_output(m, 2)
    same = torch.allclose(run(m, toks, keep=keep), run(m, toks), rtol=1e-6, atol=1e-7)
    assert same == (skip == "zero_value" or arch == "block_attnres")


@torch.no_grad()
def test_full_mask_skip_everywhere_equals_deleting_the_layer():
    m, toks = variant("full_attnres", "mask"), tokens()
    short = build_model(ModelConfig.debug("full_attnres", n_layer=5), seed=0).eval()
    sd = {k: v for k, v in m.state_dict().items() if not k.startswith("blocks.")}
    for l_new, l_old in enumerate([0, 1, 3, 4, 5]):  # routers move with their layer (pseudo-queries shift)
        sd.update({f"blocks.{l_new}.{k}": v for k, v in m.blocks[l_old].state_dict().items()})
    short.load_state_dict(sd)
    torch.testing.assert_close(run(m, toks, keep={2: torch.zeros(2, 10)}), run(short, toks), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch, skip", VARIANTS)
@torch.no_grad()
def test_layer_update_is_the_sum_of_its_two_writes(arch, skip):
    m, toks = variant(arch, skip), tokens()
    keep = skip_mask(2, 10, [2, 3])
    updates: dict[int, torch.Tensor] = {}
    ctx = m.context(10)
    m.run_layers(m.embed(toks, ctx), ctx, keep={1: keep}, on_layer=lambda pos, s, u: updates.__setitem__(pos, u))
    cache = capture(m, toks, "_out", keep={1: keep})
    for l in range(6):
        write = cache[f"blocks.{l}.hook_attn_out"] + cache[f"blocks.{l}.hook_mlp_out"]
        torch.testing.assert_close(updates[l], write * (keep[..., None] if l == 1 else 1))
    assert not updates[1][:, [2, 3]].any()


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_view_is_read_only_virtual_residual(arch):
    m, toks = variant(arch, "mask"), tokens()
    cache = capture(m, toks, "resid_post", "_out", "hook_embed")
    total = cache["hook_embed"] + sum(branch_outputs(cache, 6))
    torch.testing.assert_close(cache["blocks.5.hook_resid_post"], total, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="read-only"):
        m.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_mid", lambda x, hook: 2 * x)])
    assert math.isfinite(float(run(m, toks).sum()))

"""Shared-weight maps between depthlens's native designs and the peer packages (hyper-connections, attn-res) or a
user's own model (examples/): one place for the parameter correspondences that test_hc_mhc.py, test_attnres.py
and test_own_models.py cross-check against.

Every map copies in either direction (`into="native"` or `into="peer"`), so a test can start from whichever side
it trains or randomises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from depthlens.models import ModelConfig, build_model

HC_ROUTER_PARAMS = (
    "static_alpha",
    "dynamic_alpha_fn",
    "dynamic_alpha_scale",
    "static_beta",
    "dynamic_beta_fn",
    "dynamic_beta_scale",
)


@torch.no_grad()
def share_hc_router(router: nn.Module, peer: nn.Module, into: str) -> None:
    """depthlens HCRouter <-> lucidrains HyperConnections (same names; lucidrains' norm gain is gamma + 1)."""
    for name in HC_ROUTER_PARAMS:
        ours, theirs = getattr(router, name), getattr(peer, name)
        (ours if into == "native" else theirs).copy_(theirs if into == "native" else ours)
    if into == "native":
        router.norm.weight.copy_(peer.norm.gamma + 1.0)
    else:
        peer.norm.gamma.copy_(router.norm.weight - 1.0)


@torch.no_grad()
def share_mhc_router(router: nn.Module, user: nn.Module, into: str) -> None:
    """depthlens MHCRouter <-> examples/mhc_model.MHC (phi, bias alike; the user's alpha = [pre, post, res])."""
    ours = [router.phi, router.bias, router.alpha_pre, router.alpha_post, router.alpha_res]
    theirs = [user.phi, user.bias, user.alpha[0], user.alpha[1], user.alpha[2]]
    for a, b in zip(ours, theirs):
        (a if into == "native" else b).copy_(b if into == "native" else a)


def _native_like(arch: str, user: nn.Module, d_ff: int, **kw: Any) -> nn.Module:
    vocab, d = user.embed.weight.shape
    cfg = dict(arch=arch, d_model=d, n_layer=len(user.blocks), n_head=user.blocks[0].attn.branch.fn.n_head, d_ff=d_ff)
    cfg.update(vocab_size=vocab, max_seq_len=64, hc_streams=user.streams, **kw)
    return build_model(ModelConfig(**cfg), seed=0).eval()


@torch.no_grad()
def native_multistream(user: nn.Module, **kw: Any) -> nn.Module:
    """The native HC (examples/hc_model.HCModel) or mHC (examples/mhc_model.MHCModel) carrying `user`'s weights.

    The bodies' keys agree (norm.weight, fn.q_proj.weight, ...); the routers map by share_hc_router / share_mhc_router.
    """
    mhc = hasattr(user.blocks[0].attn, "phi")
    d_ff = user.blocks[0].mlp.branch.fn.up_proj.weight.shape[0]
    native = _native_like("mhc" if mhc else "hc", user, d_ff, **kw)
    sd = {"embed_tokens.weight": user.embed.weight, "norm.weight": user.norm.weight}
    sd["lm_head.weight"] = user.lm_head.weight
    for layer, blk in enumerate(user.blocks):
        for kind in ("attn", "mlp"):
            sd.update({f"blocks.{layer}.{kind}.{k}": v for k, v in getattr(blk, kind).branch.state_dict().items()})
    missing, unexpected = native.load_state_dict(sd, strict=False)
    assert not unexpected and all(".router_" in k for k in missing), (missing, unexpected)
    share = share_mhc_router if mhc else share_hc_router
    for blk, ublk in zip(native.blocks, user.blocks):
        share(blk.router_attn, ublk.attn, "native")
        share(blk.router_mlp, ublk.mlp, "native")
    return native


# --- AttnRes <-> kyegomez/attn-res ----------------------------------------------------------------------------


def interleave_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Our q/k rows (HF rotate_half layout) -> interleaved-pair layout (attn-res's complex RoPE); q.k is unchanged."""
    d_in = w.shape[1]
    return w.view(n_heads, 2, -1, d_in).transpose(1, 2).reshape(-1, d_in)


def deinterleave_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of interleave_rows."""
    d_in = w.shape[1]
    return w.view(n_heads, -1, 2, d_in).transpose(1, 2).reshape(-1, d_in)


@torch.no_grad()
def share_attnres_trunk(m: nn.Module, ref: nn.Module, into: str) -> None:
    """Every sublayer of a native AttnRes model `m` <-> attn-res's AttnResTransformer `ref` (n_layers = 2L).

    attn-res's key norm is weightless: into the peer, gamma is folded into w; into native, gamma = 1. The
    embedding and head are shared too (attn-res ties them; native gets both copies).
    """
    n_head, n_kv = m.config.n_head, m.config.kv_heads
    for i, layer in enumerate(ref.layers):
        blk = m.blocks[i // 2]
        sub, router = (blk.attn, blk.router_attn) if i % 2 == 0 else (blk.mlp, blk.router_mlp)
        f, g = sub.fn, layer.fn
        if i % 2 == 0:
            pairs = [(f.q_proj, g.w_q, n_head), (f.k_proj, g.w_k, n_kv), (f.v_proj, g.w_v, 0), (f.o_proj, g.w_o, 0)]
        else:
            pairs = [(f.gate_proj, g.w_gate, 0), (f.up_proj, g.w_up, 0), (f.down_proj, g.w_down, 0)]
        if into == "peer":
            layer.norm.weight.copy_(sub.norm.weight)
            layer.attn_res.pseudo_query.copy_(router.query())  # gamma folded into w
            for ours, theirs, heads in pairs:
                theirs.weight.copy_(interleave_rows(ours.weight, heads) if heads else ours.weight)
        else:
            sub.norm.weight.copy_(layer.norm.weight)
            router.pseudo_query.copy_(layer.attn_res.pseudo_query)
            router.key_norm.weight.fill_(1.0)
            for ours, theirs, heads in pairs:
                ours.weight.copy_(deinterleave_rows(theirs.weight, heads) if heads else theirs.weight)
    if into == "peer":
        ref.token_emb.weight.copy_(m.embed_tokens.weight)
    else:
        m.embed_tokens.weight.copy_(ref.token_emb.weight)
        m.lm_head.weight.copy_(ref.lm_head.weight)
        m.norm.weight.copy_(ref.out_norm.weight)


@torch.no_grad()
def native_attnres(ref: nn.Module) -> nn.Module:
    """The native Full / Block AttnRes model carrying attn-res `ref`'s weights.

    What differs by design: attn-res's final output is the plain SUM of the sources, native's is a final AttnRes
    operator; its pseudo-query is set to 0 here (uniform: the MEAN), equal to the sum after the final RMSNorm up to
    eps, so compare at a tiny eps. Block boundaries: attn-res counts sublayers (block_size = 2S); native layers.
    """
    c = ref.cfg
    block = c.attn_res_mode.name == "BLOCK"
    L = c.n_layers // 2
    cfg = ModelConfig(
        arch="block_attnres" if block else "full_attnres",
        d_model=c.d_model,
        n_layer=L,
        n_head=c.n_heads,
        n_kv_head=c.n_kv_heads,
        d_ff=c.d_ff,
        vocab_size=c.vocab_size,
        max_seq_len=c.max_seq_len,
        norm_eps=c.eps,
        rope_theta=c.rope_theta,
        attnres_block_starts=list(range(0, L, c.block_size // 2)) if block else None,
        attnres_skip="zero_value" if not block else "mask",
    )
    m = build_model(cfg, seed=0).eval()
    share_attnres_trunk(m, ref, "native")
    m.final_router.pseudo_query.zero_()
    return m

"""The tensors of a DepthModel's state dict, names and shapes, from its config alone (pure Python, no torch).

`depthlens info` on a checkpoint directory reads the safetensors header instead of building the model: these are
the tensors `DepthModel(config).state_dict()` holds (without `lm_head.weight` when the embeddings are tied, as a
checkpoint stores them), mirroring the modules of `model.py`, `backbone.py` and `residual/`. tests/test_startup.py
checks the mirror against built models of every design and of the config fields that change a shape.
"""

from __future__ import annotations

from typing import Any

Shape = tuple[int, ...]


def tensor_layout(config: Any) -> dict[str, Shape]:
    """{state-dict name: shape} of `DepthModel(config)` as a checkpoint stores it (tied lm_head left out).

    ValueError for a design this mirror does not know (the caller builds the model instead)."""
    cfg = config.resolved()
    arch = cfg.arch
    d, V, L = cfg.d_model, cfg.vocab_size, cfg.n_layer
    q, kv, f = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn_dim
    n = cfg.hc_streams
    out: dict[str, Shape] = {"embed_tokens.weight": (V, d)}
    for layer in range(L):
        b = f"blocks.{layer}."
        # the two bodies (backbone.Sublayer): pre-norm + Attention | SwiGLU MLP [+ Sandwich's post-norm]
        out[b + "attn.norm.weight"] = (d,)
        out[b + "attn.fn.q_proj.weight"] = (q, d)
        out[b + "attn.fn.k_proj.weight"] = (kv, d)
        out[b + "attn.fn.v_proj.weight"] = (kv, d)
        out[b + "attn.fn.o_proj.weight"] = (d, q)
        out[b + "mlp.norm.weight"] = (d,)
        out[b + "mlp.fn.gate_proj.weight"] = (f, d)
        out[b + "mlp.fn.up_proj.weight"] = (f, d)
        out[b + "mlp.fn.down_proj.weight"] = (d, f)
        if arch == "sandwich":
            out[b + "attn.post_norm.weight"] = (d,)
            out[b + "mlp.post_norm.weight"] = (d,)
        if arch == "moda":  # MoDAMLPBody: the FFN-side depth K/V projections
            out[b + "mlp.depth_k_proj.weight"] = (kv, d)
            out[b + "mlp.depth_v_proj.weight"] = (kv, d)
        # the two routers (residual/): sublayer j = 2 * layer (attention), 2 * layer + 1 (MLP)
        for j, r in ((2 * layer, b + "router_attn."), (2 * layer + 1, b + "router_mlp.")):
            out.update({r + k: s for k, s in _router(arch, j, d, n, cfg.hc_dynamic).items()})
    if arch in ("full_attnres", "block_attnres"):  # the final AttnRes operator
        out["final_router.pseudo_query"] = (d,)
        out["final_router.key_norm.weight"] = (d,)
    if not (arch == "deepnorm" and not cfg.deepnorm_final_norm):
        out["norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (V, d)
    return out


def _router(arch: str, j: int, d: int, n: int, dynamic: bool) -> dict[str, Shape]:
    """The parameters of sublayer j's router, by name within it."""
    if arch in ("preln", "lns", "sandwich", "deepnorm", "moda"):  # additive / DeepNorm (the body's norm) / MoDA
        return {}
    if arch == "keel":  # sublayer 0 is Pre-LN; every later one owns a trunk norm
        return {} if j == 0 else {"trunk_norm.weight": (d,)}
    if arch == "hc":
        p: dict[str, Shape] = {"static_alpha": (n, n + 1), "static_beta": (n,)}
        if dynamic:
            p.update(
                {
                    "norm.weight": (d,),
                    "dynamic_alpha_fn": (d, n + 1),
                    "dynamic_alpha_scale": (),
                    "dynamic_beta_fn": (d,),
                    "dynamic_beta_scale": (),
                }
            )
        return p
    if arch == "mhc":
        m = n * n + 2 * n
        return {"phi": (n * d, m), "bias": (m,), "alpha_pre": (), "alpha_post": (), "alpha_res": ()}
    if arch in ("full_attnres", "block_attnres"):
        return {"pseudo_query": (d,), "key_norm.weight": (d,)}
    raise ValueError(f"no tensor layout for design {arch!r}")

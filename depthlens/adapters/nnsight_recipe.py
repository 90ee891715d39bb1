"""Recipe: the causal score (docs/concepts.md#causal-score, `current` variant) written with nnsight, for users who live
there.

    C[s, t] = AGG_{b, tau in [1, T)}  ||u_t^(skip s)(b, tau) - u_t(b, tau)|| / max(||u_t(b, tau)||, eps)

with u_t = h_{t+1} - h_t, and "skip s" = set layer s's output to its input at positions [1, T)
(Csordas' `merge_io`, position 0 is never touched). It returns the full (L, L) matrix: C[s, s] = 1 and
C[s, t] = 0 for t < s by construction; the score proper is the upper triangle.

Works on three kinds of model, through the residual sites each exposes:

* a depthlens `DepthModel` or `HFLayeredModel`: `blocks[i].hook_resid_pre.output` / `hook_resid_post.output`
  (hook points are modules, so nnsight reaches them as it reaches any module);
* a raw HF `*ForCausalLM` (LLaMA, Qwen2/3, Mistral, GPT-2): the decoder layer's `.input` / `.output`,
  at the path its AdapterSpec names (`model.layers`, `transformer.h`).

The pattern, for one skipped layer s (one trace per intervention, L + 1 traces in all):

    with torch.no_grad(), net.trace(tokens):
        for t in range(L):                      # in execution order: nnsight forbids reading backwards
            pre, post = h_in(t), h_out(t)
            if t == s:                          # skip s on [1, T): its output := its input there
                post = torch.cat([post[:, :1], pre[:, 1:]], 1)
                set_out(t, post)
            ratios.append(reduce(post - pre, clean[t]))    # stream-reduce; never cache (L, B, T, d)

Why not `tracer.invoke` batching: a plain `NNsight` refuses several invokes, and on multi-stream models
that fold streams into the batch, per-invoke edits leak across rows (docs/foreign-models.md#nnsight). depthlens' own
engine batches interventions along the batch itself; this recipe stays one trace per intervention.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce as _reduce
from typing import Any

import torch

EPS = 1e-6


Read = Callable[[Any, int], Any]  # (traced model, layer) -> the residual proxy at that site


def _sites(model: Any) -> tuple[int, Read, Read, Callable[[Any, int, Any], None]]:
    """(L, h_in(net, t), h_out(net, t), set_out(net, t, value)) for a depthlens or a raw HF model."""
    if hasattr(model, "hook_dict") and "blocks.0.hook_resid_post" in model.hook_dict:
        L = len(model.blocks)

        def h_in(net: Any, t: int) -> Any:
            return net.blocks[t].hook_resid_pre.output

        def h_out(net: Any, t: int) -> Any:
            return net.blocks[t].hook_resid_post.output

        def set_out(net: Any, t: int, value: Any) -> None:
            net.blocks[t].hook_resid_post.output = value

        return L, h_in, h_out, set_out
    from .families import spec_for

    path = spec_for(getattr(model.config, "model_type", None)).blocks.split(".")

    def layer(net: Any, t: int) -> Any:
        return _reduce(getattr, path, net)[t]

    def h_in_hf(net: Any, t: int) -> Any:
        return layer(net, t).input

    def h_out_hf(net: Any, t: int) -> Any:
        out = layer(net, t).output
        return out[0] if isinstance(out, tuple) else out  # transformers 4.x layers return tuples

    def set_out_hf(net: Any, t: int, value: Any) -> None:
        out = layer(net, t).output
        layer(net, t).output = (value, *out[1:]) if isinstance(out, tuple) else value

    return len(_reduce(getattr, path, model)), h_in_hf, h_out_hf, set_out_hf


def _ratio(new: torch.Tensor, old: torch.Tensor, agg: str, eps: float) -> torch.Tensor:
    """AGG over (b, tau in [1, T)) of ||new - old|| / max(||old||, eps); inputs (B, T, d), fp32 or better."""
    new, old = new[:, 1:].double(), old[:, 1:].double()
    if agg == "pooled":
        return (new - old).norm() / old.norm().clamp_min(eps)
    r = (new - old).norm(dim=-1) / old.norm(dim=-1).clamp_min(eps)  # (B, T-1)
    return r.max() if agg == "max" else r.mean()


@torch.no_grad()
def causal_matrix_nnsight(model: Any, tokens: torch.Tensor, *, agg: str = "max", eps: float = EPS) -> torch.Tensor:
    """The (L, L) causal-score matrix of `model` on `tokens` (B, T), computed through `nnsight.NNsight`.

    agg: "max" (Csordas-exact, over tokens of the batch), "mean" (over tokens) or "pooled"
    (||U' - U||_F / ||U||_F). Returns float64 on CPU.
    """
    from nnsight import NNsight

    if agg not in ("max", "mean", "pooled"):
        raise ValueError(f"agg must be 'max', 'mean' or 'pooled', got {agg!r}")
    if tokens.shape[1] < 2:
        raise ValueError("need at least 2 positions (position 0 is never intervened on)")
    L, h_in, h_out, set_out = _sites(model)
    net = NNsight(model)
    clean: list[torch.Tensor] = []
    with net.trace(tokens):
        for t in range(L):
            pre = h_in(net, t)  # read the input first: nnsight runs the body in the model's execution order
            clean.append(h_out(net, t) - pre)  # real tensors in nnsight 0.8; a list from outside survives
    C = torch.zeros(L, L, dtype=torch.float64)
    for s in range(L):
        row: list[torch.Tensor] = []
        with net.trace(tokens):
            for t in range(L):
                pre, post = h_in(net, t), h_out(net, t)
                if t == s:
                    post = torch.cat([post[:, :1], pre[:, 1:]], 1)
                    set_out(net, t, post)
                row.append(_ratio(post - pre, clean[t], agg, eps).cpu())
        C[s] = torch.stack(row)
    return C


@torch.no_grad()
def causal_matrix_reference(model: Any, tokens: torch.Tensor, *, agg: str = "max", eps: float = EPS) -> torch.Tensor:
    """The same matrix with plain protocol calls (no nnsight, no hooks): the cross-check for the recipe."""
    L = model.n_layer
    B, T = tokens.shape

    def updates(keep: dict[int, torch.Tensor] | None) -> list[torch.Tensor]:
        ctx = model.context(T, device=tokens.device)
        out: list[torch.Tensor] = []
        model.run_layers(model.embed(tokens, ctx), ctx, keep=keep, on_layer=lambda p, st, u: out.append(u))
        return out

    clean = updates(None)
    C = torch.zeros(L, L, dtype=torch.float64)
    for s in range(L):
        k = torch.ones(B, T, device=tokens.device)
        k[:, 1:] = 0
        C[s] = torch.stack([_ratio(u, c, agg, eps).cpu() for u, c in zip(updates({s: k}), clean)])
    return C

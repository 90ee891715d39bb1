"""The batched causal / permutation engine against an independent plain-hook computation on an HF LLaMA (the
1e-6 docs/performance.md quotes).

The reference never touches depthlens' `run_layers`: it runs `LlamaForCausalLM.forward` once per intervention,
with forward hooks on the decoder layers (skip = the layer's output replaced by its input on [1, T), Csordás'
merge_io) or with the decoder layers reordered in the ModuleList (swap). Updates u_t = output − input of
each layer, probabilities from HF's logits. The model runs in float64; the engine keeps token ratios and
probabilities in float32, hence the 1e-6 relative tolerance. Several row/sequence batchings are compared, so
the engine's batching (arms along the batch, per-arm head calls, in-place vocabulary work, the lse-based
NLL/KL) cannot change any number beyond float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.runtime.evaldata import EvalData
from depthlens.stats.metrics import late_pairs


def close(a, b) -> bool:
    return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoModelForCausalLM

    from depthlens.adapters.hf import HFLayeredModel, debug_config

    torch.manual_seed(0)
    cfg = debug_config("llama", num_hidden_layers=6, vocab_size=997)
    hf = AutoModelForCausalLM.from_config(cfg).double().eval()
    toks = torch.randint(3, 997, (3, 11), generator=torch.Generator().manual_seed(1))
    toks[:, 0] = 1
    return hf, HFLayeredModel(hf), toks


def _hf_run(hf, toks, skip: int | None = None, order: list[int] | None = None):
    """(updates {l: (B, T, d)}, logits (B, T, V)) from HF's own forward, hooks only."""
    layers = hf.model.layers
    ups, hooks = {}, []
    for pos, layer in enumerate(layers):

        def hook(mod, args, kwargs, out, pos=pos):
            h_in = args[0] if args else kwargs["hidden_states"]
            h_out = out[0] if isinstance(out, tuple) else out
            if pos == skip:
                h_out = torch.cat([h_out[:, :1], h_in[:, 1:]], dim=1)  # merge_io: [1, T) keeps its input
            ups[pos] = h_out - h_in
            return (h_out, *out[1:]) if isinstance(out, tuple) else h_out

        hooks.append(layer.register_forward_hook(hook, with_kwargs=True))
    saved = list(layers)
    try:
        if order is not None:  # position p runs decoder layer order[p]
            for p, src in enumerate(order):
                layers[p] = saved[src]
        logits = hf(toks, use_cache=False).logits
    finally:
        for p, mod in enumerate(saved):
            layers[p] = mod
        for h in hooks:
            h.remove()
    return ups, logits


def _nll(logits, toks):
    return -torch.log_softmax(logits[:, 1:-1], -1).gather(-1, toks[:, 2:, None]).squeeze(-1)


@pytest.mark.parametrize("opts", [{}, {"batch_size": 3}, {"batch_size": 5, "seq_batch": 2}, {"seq_batch": 1}])
def test_causal_matches_plain_hooks(setup, opts):
    hf, model, toks = setup
    L = model.n_layer
    with torch.no_grad():
        ds = causal_scores(model, EvalData.from_tokens(toks), variants=("current",), layers="all", outputs=True, **opts)
        clean_u, clean_logits = _hf_run(hf, toks)
        p0, nll0 = clean_logits.softmax(-1), _nll(clean_logits, toks)
        C = ds.causal_score.sel(variant="current")
        for s in range(L):
            u, logits = _hf_run(hf, toks, skip=s)
            for t in range(s, L):
                diff = (u[t] - clean_u[t])[:, 1:]
                r = diff.norm(dim=-1) / clean_u[t][:, 1:].norm(dim=-1).clamp_min(1e-6)
                pooled = (diff.square().sum() / clean_u[t][:, 1:].square().sum()).sqrt()
                for agg, ref in (("max", r.max()), ("mean", r.mean()), ("pooled", pooled)):
                    assert close(C.sel(aggregator=agg)[s, t], ref), (agg, s, t)
            o = (logits.softmax(-1) - p0).norm(dim=-1)[:, 1:].max()
            assert close(ds.output_effect.sel(variant="current")[s], o)
            assert close(ds.skip_delta_loss[s], (_nll(logits, toks) - nll0).mean())
        assert float(ds.null_score.sel(variant="current")) == 0  # skipping nothing changes nothing


@pytest.mark.parametrize("opts", [{}, {"batch_size": 2}, {"batch_size": 7, "seq_batch": 3}])
def test_permutation_matches_plain_reordering(setup, opts):
    hf, model, toks = setup
    L = model.n_layer
    with torch.no_grad():
        ds = permutation_scores(model, EvalData.from_tokens(toks), pairs="all", **opts)
        _, z0 = _hf_run(hf, toks)
        logp0 = torch.log_softmax(z0[:, 1:-1], -1)
        for i, j in late_pairs(L, 0):
            order = list(range(L))
            order[i], order[j] = j, i
            _, z = _hf_run(hf, toks, order=order)
            logp = torch.log_softmax(z[:, 1:-1], -1)
            d = (_nll(z, toks) - _nll(z0, toks)).mean()
            kl = (logp0.exp() * (logp0 - logp)).sum(-1).mean()
            assert close(ds.perm_abs[i, j], d) and close(ds.perm_abs[j, i], d)
            assert close(ds.perm_kl[i, j], kl)
    assert np.all(np.diag(ds.perm_abs.values) == 0)

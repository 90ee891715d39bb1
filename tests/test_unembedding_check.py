"""The generic HF path splits the LM head (final norm + LM head -> F.linear on its input, walked in vocabulary
chunks) only when that is the model's head (adapters/generic._check_unembedding, issue 35): a decision that
depends on neither the dtype nor the machine. A correct model is split in fp32, bf16 and fp16, even when the two
paths sum their dot products in another order (as two kernels, or one at another thread count, do); a model
that transforms its logits after the head (Gemma 2's soft-capping at 30, which the old fixed 1e-4 tolerance let
through on a small model, a logit scale, a forward hook on the head) is never split, in any dtype. Tiny models
built from transformers config classes, no downloads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import tiny_hf

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
KW = dict(num_key_value_heads=2, head_dim=8)


def _tiny(model_type: str, dtype: torch.dtype, **kw):
    sizes = dict(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_attention_heads=4, max_position_embeddings=64
    )
    return tiny_hf(model_type, **{**sizes, **kw}).to(dtype)


def _generic(hf):
    from depthlens.adapters.generic import GenericBlocksModel

    return GenericBlocksModel(hf)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_correct_head_is_split_in_every_dtype(dtype):
    from depthlens.models.protocol import same_logits

    g = _generic(_tiny("llama", dtype, **KW))
    u = g.unembedding()
    assert u is not None
    ctx = g.context(6)
    state = {"h": torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3)).to(dtype)}
    with torch.no_grad():
        split = torch.nn.functional.linear(u.hidden(state, ctx), u.weight, u.bias)
        assert same_logits(split, g.head(state, ctx))


class _SplitK:
    """torch.nn.functional with `linear` summing each dot product in two halves, each rounded to the dtype:
    what another kernel's blocking (or another thread count) does. Correct to the dtype's rounding."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def linear(x, w, b=None):
        k = x.shape[-1] // 2
        lin = torch.nn.functional.linear
        return lin(x[..., :k], w[:, :k]) + lin(x[..., k:], w[:, k:], b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_head_summed_in_another_order_is_still_split(dtype, monkeypatch):
    from depthlens.adapters import generic

    g = _generic(_tiny("llama", dtype, **KW))
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    w = g.hf.get_output_embeddings().weight
    if dtype != torch.float32:  # the reordered sum really differs in the last bits (the old check refused it)
        assert not torch.equal(_SplitK.linear(x, w), torch.nn.functional.linear(x, w))
    monkeypatch.setattr(generic, "F", _SplitK())
    assert g._check_unembedding() is not None


def _soft_cap_hook(module, args, out):
    return 30 * torch.tanh(out / 30)


TRANSFORMED = {
    "gemma2 soft-capping 30": lambda dt: _tiny("gemma2", dt, sliding_window=4, **KW),
    "cohere logit scale": lambda dt: _tiny("cohere", dt, **KW),
    "forward hook on the head": lambda dt: _tiny("llama", dt, **KW),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", TRANSFORMED)
def test_a_transform_after_the_head_is_never_split(case, dtype):
    hf = TRANSFORMED[case](dtype)
    if case == "forward hook on the head":
        hf.get_output_embeddings().register_forward_hook(_soft_cap_hook)
    g = _generic(hf)
    assert g.unembedding() is None
    if case == "gemma2 soft-capping 30":  # the twin without the cap is split: the refusal is the cap's
        assert _generic(_tiny("gemma2", dtype, sliding_window=4, final_logit_softcapping=None, **KW)).unembedding()


def test_the_agreement_bound_is_the_dot_products_rounding():
    """`_head_agrees` against the bound computed independently in numpy: just inside accepted, just outside
    refused, per row and vocabulary id; the bound scales with the dtype's eps."""
    from depthlens.adapters.generic import _head_agrees

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 3, 16, generator=g), torch.randn(40, 16, generator=g), torch.randn(40, generator=g)
    direct = torch.nn.functional.linear(x, w, b)
    xn = np.linalg.norm(x.double().numpy(), axis=-1, keepdims=True)
    wn = np.linalg.norm(w.double().numpy(), axis=-1)
    for dtype in DTYPES:
        eps = torch.finfo(dtype).eps
        bound = torch.from_numpy(4.0 * eps * (xn * wn + np.abs(b.double().numpy())))  # sqrt(16) = 4
        for at in [(0, 0, 5), (1, 2, 39)]:  # logits in float64: the eps is the weights' (coarser) dtype's
            inside, outside = direct.double().clone(), direct.double().clone()
            inside[at] -= 0.9 * bound[at]
            outside[at] -= 1.1 * bound[at]
            assert _head_agrees(inside, direct.double(), x, w.to(dtype), b)
            assert not _head_agrees(outside, direct.double(), x, w.to(dtype), b)
    nan = direct.clone()
    nan[0, 0, 0] = float("nan")
    assert not _head_agrees(nan, direct, x, w, b)
    assert not _head_agrees(direct[..., :-1], direct, x, w, b)  # another shape


@pytest.mark.parametrize("path", ["hand-mapped", "generic-blocks"])
def test_a_hook_put_on_the_head_after_the_check_unsplits_it(path):
    """F.linear on the head's weight would bypass a PyTorch hook on the head module, so a hooked head is not
    split, asked on every call (the generic path's numeric check is cached)."""
    from depthlens.adapters.hf import HFLayeredModel

    hf = _tiny("llama", torch.float32, **KW)
    m = HFLayeredModel(hf) if path == "hand-mapped" else _generic(hf)
    assert m.unembedding() is not None
    for add in ("register_forward_hook", "register_forward_pre_hook"):
        handle = getattr(hf.get_output_embeddings(), add)(lambda *a: None)
        assert m.unembedding() is None
        handle.remove()
        assert m.unembedding() is not None

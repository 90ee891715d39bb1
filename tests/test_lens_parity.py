"""The TransformerLens surface users reach for on `Lens`: to_str_tokens, W_E, W_U, greedy generate, and
logit_attrs (through tokens_to_residual_directions), each checked against an independent computation."""

from __future__ import annotations

import pytest
import torch

from depthlens.adapters.lens import Lens
from depthlens.data.tokenizers import ByteTokenizer
from depthlens.models import ModelConfig, build_model


@pytest.fixture(scope="module")
def lens():
    m = build_model(ModelConfig.debug("preln", n_layer=3, vocab_size=257), seed=0)
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)  # a final-norm gain that is not 1: logit_attrs must fold it in
    return Lens(m, ByteTokenizer())


def test_weights_are_the_models_and_give_its_logits(lens):
    m = lens.model
    assert lens.W_E.shape == (257, m.config.d_model) and lens.W_E is m.embed_tokens.weight
    assert lens.W_U.shape == (m.config.d_model, 257)
    toks = lens.to_tokens("depth")
    logits, cache = lens.run_with_cache(toks)
    h = cache[f"blocks.{m.n_layer - 1}.hook_resid_post"]
    by_hand = (m.norm.weight * h / h.pow(2).mean(-1, keepdim=True).add(m.norm.eps).sqrt()) @ lens.W_U
    torch.testing.assert_close(by_hand, logits, rtol=1e-5, atol=1e-5)


def test_to_str_tokens_one_string_per_token(lens):
    assert lens.to_str_tokens("hi!") == ["<bos>", "h", "i", "!"]
    assert lens.to_str_tokens("hi", prepend_bos=False) == ["h", "i"]
    assert lens.to_str_tokens(torch.tensor([[104, 105], [33, 33]])) == [["h", "i"], ["!", "!"]]
    assert lens.to_single_token("h") == 104
    with pytest.raises(ValueError, match="2 tokens"):
        lens.to_single_token("hi")


def test_generate_is_greedy_decoding(lens):
    toks = lens.to_tokens("ab")
    out = lens.generate(toks, max_new_tokens=4)
    ref = toks.clone()  # an independent loop: argmax of the plain forward, one token at a time
    for _ in range(4):
        ref = torch.cat([ref, lens.model(ref)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, ref)
    text = lens.generate("ab", max_new_tokens=4)
    assert isinstance(text, str) and text == lens.to_string(ref[0])
    with pytest.raises(NotImplementedError, match="greedily"):
        lens.generate("ab", do_sample=True)


def test_logit_attrs_sum_to_the_logit(lens):
    toks = lens.to_tokens("residual")
    logits, cache = lens.run_with_cache(toks)
    stack = cache.decompose_resid(apply_ln=False)  # embed, then each attention and MLP output
    for t in (5, 104):
        attrs = cache.logit_attrs(stack, tokens=torch.tensor([t]))  # (components, B, T)
        torch.testing.assert_close(attrs.sum(0)[0], logits[0, :, t], rtol=1e-4, atol=1e-5)
    diff = cache.logit_attrs(stack, tokens="a", incorrect_tokens="b").sum(0)[0]
    torch.testing.assert_close(diff, logits[0, :, 97] - logits[0, :, 98], rtol=1e-4, atol=1e-5)


def test_on_a_foreign_model_what_works_works_and_the_rest_is_refused_in_one_line(lens, tmp_path):
    """hooks.md and foreign-models.md say the same, and this is what they say: on an HF model through the adapter,
    the cache's stacks work without LN scaling and equal the native model's; apply_ln and logit_attrs, which need
    the norms' recorded scales and gains, are refused with one line instead of a KeyError or IndexError."""
    from depthlens.adapters.convert import export_llama
    from depthlens.adapters.load import load_any

    hf, _ = load_any(export_llama(lens.model, tmp_path / "hf"))
    foreign = Lens(hf, ByteTokenizer())
    toks = lens.to_tokens("residual")
    _, cache = foreign.run_with_cache(toks)
    _, native = lens.run_with_cache(toks)
    torch.testing.assert_close(cache.decompose_resid(), native.decompose_resid(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache.accumulated_resid(), native.accumulated_resid(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(foreign.W_U, lens.W_U) and torch.testing.assert_close(foreign.W_E, lens.W_E)
    with pytest.raises(ValueError, match="apply_ln=False"):
        cache.accumulated_resid(apply_ln=True)
    with pytest.raises(NotImplementedError, match="native depthlens models"):
        cache.logit_attrs(cache.decompose_resid(), tokens=torch.tensor([5]))

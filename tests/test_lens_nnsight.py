"""TransformerLens and nnsight interop: ActivationCache and patching on depthlens models, TransformerBridge
models analysed through the adapter, and the nnsight causal-score recipe against the engine (to 1e-5, as
docs/foreign-models.md says)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.models import ModelConfig, build_model

B, T = 2, 12


def _tokens(vocab: int, seed: int = 0, b: int = B, t: int = T) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _hf(model_type: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    from depthlens.adapters.hf import debug_config

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(debug_config(model_type)).eval()


@pytest.fixture(scope="module")
def models():
    """Three model_likes with TransformerLens hook names: native Pre-LN, adapted LLaMA, adapted GPT-2."""
    from depthlens.adapters import HFLayeredModel

    return {
        "depthlens": build_model(ModelConfig.debug("preln"), seed=1).eval(),
        "hf-llama": HFLayeredModel(_hf("llama")),
        "hf-gpt2": HFLayeredModel(_hf("gpt2")),
    }


def _vocab(m) -> int:
    return m.config.vocab_size


# --- TransformerLens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["depthlens", "hf-llama", "hf-gpt2"])
def test_run_with_cache_gives_an_activation_cache(models, name):
    from transformer_lens import ActivationCache

    from depthlens.adapters import Lens, attached_hooks

    m = models[name]
    lens = Lens(m)
    toks = _tokens(_vocab(m))
    logits, cache = lens.run_with_cache(toks)
    assert isinstance(cache, ActivationCache)
    L, d = m.n_layer, m.config.d_model
    for i in range(L):
        for site in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
            assert cache[f"blocks.{i}.hook_{site}"].shape == (B, T, d)
    torch.testing.assert_close(cache["resid_pre", 1], cache["blocks.0.hook_resid_post"])
    acc = cache.accumulated_resid()  # h_0 .. h_L, the last one before the final norm
    assert acc.shape == (L + 1, B, T, d)
    torch.testing.assert_close(acc[:L], torch.stack([cache[f"blocks.{i}.hook_resid_pre"] for i in range(L)]))
    torch.testing.assert_close(acc[L], cache["hook_resid_final"])
    assert cache.stack_activation("resid_post").shape == (L, B, T, d)
    torch.testing.assert_close(logits, m(toks))
    assert attached_hooks(m) == [] and attached_hooks(lens) == []


def test_patching_runs_on_a_depthlens_model(models):
    from transformer_lens import patching

    from depthlens.adapters import Lens, attached_hooks

    m = models["depthlens"]
    lens = Lens(m)
    clean, corrupt = _tokens(_vocab(m), 0), _tokens(_vocab(m), 1)

    def metric(logits):
        return logits[:, -1, 3].mean()

    _, clean_cache = lens.run_with_cache(clean)
    res = patching.get_act_patch_resid_pre(lens, corrupt, clean_cache, metric)
    assert res.shape == (m.n_layer, T)

    def put(x, hook):  # the same patch by hand: layer 2's input at position 5 from the clean run
        x = x.clone()
        x[:, 5] = clean_cache["blocks.2.hook_resid_pre"][:, 5]
        return x

    manual = metric(m.run_with_hooks(corrupt, fwd_hooks=[("blocks.2.hook_resid_pre", put)]))
    assert res[2, 5].item() == pytest.approx(manual.item(), abs=1e-6)
    # patching a run with its own activations changes nothing
    same = patching.get_act_patch_resid_pre(lens, clean, clean_cache, metric)
    torch.testing.assert_close(same, metric(m(clean)).expand_as(same))
    assert attached_hooks(m) == []


def test_to_tokens_uses_the_models_tokenizer(models):
    from depthlens.adapters import Lens
    from depthlens.data.tokenizers import ByteTokenizer

    m = build_model(ModelConfig.debug("preln", vocab_size=257))
    assert Lens(m, ByteTokenizer()).to_tokens("hi").tolist() == [[256, 104, 105]]
    assert Lens(m, ByteTokenizer()).to_tokens("hi", prepend_bos=False).tolist() == [[104, 105]]
    with pytest.raises(ValueError, match="no tokenizer"):
        Lens(models["depthlens"]).to_tokens("hi")


def test_transformer_bridge_is_analysed_through_the_adapter():
    """A TransformerBridge built offline from an HF config, wrapped by the adapter."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    from depthlens.adapters import from_bridge
    from depthlens.adapters.nnsight_recipe import causal_matrix_reference

    hf = _hf("llama", seed=4)
    toks = _tokens(101, 2)
    with torch.no_grad():
        before = hf(toks).logits
    bridge = build_bridge_from_module(hf, "LlamaForCausalLM", hf_config=hf.config)
    names = {n: hp.name for n, hp in bridge.hook_dict.items()}
    w = from_bridge(bridge)
    with torch.no_grad():
        torch.testing.assert_close(w(toks), bridge(toks), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w(toks), before, rtol=1e-5, atol=1e-5)
    assert {n: hp.name for n, hp in bridge.hook_dict.items()} == names  # the bridge's own names untouched
    assert all(n.startswith(("blocks.", "hook_")) for n in w.hook_dict)
    C = causal_matrix_reference(w, toks)
    assert torch.allclose(C.diagonal(), torch.ones(4, dtype=C.dtype)) and (C.triu(1)[0, 1:] > 0).all()
    _, cache = bridge.run_with_cache(toks)  # the bridge's residual hook equals the adapter's
    _, mine = w.run_with_cache(toks)
    torch.testing.assert_close(mine["blocks.2.hook_resid_pre"], cache["blocks.2.hook_resid_pre"], rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="original_model"):
        from_bridge(object())


# --- nnsight -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["depthlens", "hf-llama"])
def test_nnsight_reads_and_edits_a_layer_output(models, name):
    from nnsight import NNsight

    from depthlens.adapters import attached_hooks

    m = models[name]
    toks = _tokens(_vocab(m), 3)
    _, cache = m.run_with_cache(toks)
    net = NNsight(m)
    with torch.no_grad(), net.trace(toks):
        h = net.blocks[2].hook_resid_post.output.save()
    torch.testing.assert_close(h, cache["blocks.2.hook_resid_post"])
    with torch.no_grad(), net.trace(toks):  # skip layer 2 on [1, T): output := input there
        pre = net.blocks[2].hook_resid_pre.output
        post = net.blocks[2].hook_resid_post.output
        net.blocks[2].hook_resid_post.output = torch.cat([post[:, :1], pre[:, 1:]], 1)
        out = net.output.save()
    keep = torch.ones(B, T)
    keep[:, 1:] = 0
    with torch.no_grad():
        torch.testing.assert_close(out, m(toks, keep={2: keep}), rtol=1e-5, atol=1e-6)
    assert attached_hooks(m) == []


@pytest.mark.parametrize("name", ["depthlens", "hf-llama", "hf-gpt2", "raw-hf-qwen3"])
def test_nnsight_recipe_equals_the_engine(models, name):
    from depthlens.adapters import HFLayeredModel
    from depthlens.adapters.nnsight_recipe import causal_matrix_nnsight, causal_matrix_reference
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    if name == "raw-hf-qwen3":  # nnsight on the HF model itself (layer .input/.output); engine via the adapter
        raw = _hf("qwen3", seed=5)
        subject, engine_model = raw, HFLayeredModel(raw)
    else:
        subject = engine_model = models[name]
    toks = _tokens(engine_model.config.vocab_size, 6, b=3, t=10)
    ds = api.causal(engine_model, EvalData.from_tokens(toks), variants=("current",), null=False, outputs=False)
    for agg in ("max", "pooled"):
        C = causal_matrix_nnsight(subject, toks, agg=agg).numpy()
        E = ds.causal_score.sel(variant="current", aggregator=agg).values
        iu = np.triu_indices(C.shape[0], 1)
        np.testing.assert_allclose(C[iu], E[iu], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.diag(C), 1.0, atol=1e-6)
        assert np.all(np.tril(C, -1) == 0)
    torch.testing.assert_close(
        causal_matrix_nnsight(subject, toks), causal_matrix_reference(engine_model, toks), rtol=1e-5, atol=1e-6
    )

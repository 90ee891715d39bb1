"""The generic-blocks path (adapters/generic.py): any decoder-only HF model whose blocks form one ModuleList,
checked against HF's own forward with Csordás-style block interventions, and against the hand-mapped LLaMA
adapter on the same model. docs/foreign-models.md quotes both tolerances (1e-6 against HF, 1e-5 against the LLaMA
adapter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.errors import CheckpointError

T = 10


def _tiny(model_type: str, seed: int = 0, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    base = dict(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    base.update(kw)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **base)).eval()


# three families without a hand-mapped adapter (parallel attn+MLP, sandwich norms + alternating sliding window
# + soft-capping, post-norm), built offline from transformers config classes
FAMILIES = {
    "gpt_neox": dict(),
    "gemma2": dict(num_key_value_heads=2, head_dim=8, sliding_window=4),
    "olmo2": dict(num_key_value_heads=2),
    "phi": dict(),
}


def _ids(seed=0, b=2):
    return torch.randint(0, 101, (b, T), generator=torch.Generator().manual_seed(seed))


def _passthrough(module, args, kwargs, out):
    """HF forward hook: the block's output := its input (Csordás' skip at block level)."""
    h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    return (h, *out[1:]) if isinstance(out, tuple) else h


@pytest.mark.parametrize("fam", FAMILIES)
def test_generic_blocks_match_hf_forward_skip_and_swap(fam):
    from depthlens.adapters.generic import GenericBlocksModel
    from depthlens.adapters.hf import wrap

    hf = _tiny(fam, **FAMILIES[fam])
    g = wrap(hf)
    assert isinstance(g, GenericBlocksModel) and g.adapter_path == "generic-blocks" and g.n_layer == 4
    x = _ids()
    with torch.no_grad():
        torch.testing.assert_close(g(x), hf(x).logits, rtol=0, atol=1e-6)
        ctx = g.context(T)
        # skip block 2 on every token == HF forward with block 2's output replaced by its input
        skipped = g.head(g.run_layers(g.embed(x, ctx), ctx, keep={2: torch.zeros(2, T)}), ctx)
        handle = g.layers[2].register_forward_hook(_passthrough, with_kwargs=True)
        try:
            ref = hf(x).logits
        finally:
            handle.remove()
        torch.testing.assert_close(skipped, ref, rtol=0, atol=1e-6)
        assert (skipped - hf(x).logits).abs().max() > 1e-3  # the skip did something
        # swap blocks 1 and 2 == HF forward with its ModuleList permuted
        order = [0, 2, 1, 3]
        swapped = g.head(g.run_layers(g.embed(x, ctx), ctx, order=order), ctx)
        saved = list(g.layers)
        try:
            for i, j in enumerate(order):
                g.layers[i] = saved[j]
            ref = hf(x).logits
        finally:
            for i, m in enumerate(saved):
                g.layers[i] = m
        torch.testing.assert_close(swapped, ref, rtol=0, atol=1e-6)
        # a token-level skip touches only the masked tokens' own block output
        keep = torch.ones(2, T)
        keep[:, 5:] = 0
        part = g.run_layers(g.embed(x, ctx), ctx, keep={1: keep}, stop=2)["h"]
        full = g.run_layers(g.embed(x, ctx), ctx, stop=2)["h"]
        torch.testing.assert_close(part[:, :5], full[:, :5])


def test_generic_path_equals_the_hand_mapped_llama_adapter():
    from depthlens.adapters.generic import GenericBlocksModel
    from depthlens.adapters.hf import HFLayeredModel
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    hf = _tiny("llama", num_key_value_heads=2, head_dim=8)
    hand, gen = HFLayeredModel(hf), GenericBlocksModel(hf)
    data = EvalData.from_tokens(torch.randint(0, 101, (3, 24), generator=torch.Generator().manual_seed(1)))
    a, b = api.causal(hand, data, variant="future"), api.causal(gen, data, variant="future")
    np.testing.assert_allclose(a["causal_score"].values, b["causal_score"].values, atol=1e-5)
    assert np.isfinite(a["causal_score"].values).any()
    a, b = api.permutation(hand, data, layers="all"), api.permutation(gen, data, layers="all")
    for v in ("perm_abs", "perm_kl"):
        np.testing.assert_allclose(a[v].values, b[v].values, atol=1e-5)
    assert b.attrs["design"] == "generic" and a.attrs["design"] == "preln"
    assert (a.attrs["head_path"], b.attrs["head_path"]) == ("vocab-chunked", "vocab-chunked")
    gen._unembedding = None  # the whole-logits loss path (a generic head with a logit transform) agrees too
    c = api.permutation(gen, data, layers="all")
    assert c.attrs["head_path"] == "whole-logits"
    for v in ("perm_abs", "perm_kl"):
        np.testing.assert_allclose(a[v].values, c[v].values, atol=1e-5)
    with pytest.raises(ValueError, match="whole blocks only"):
        ctx = gen.context(T)
        gen.run_layers(gen.embed(_ids(), ctx), ctx, unit="attn")


def test_generic_family_by_path_records_the_path(tmp_path):
    from depthlens.adapters.load import open_model
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    _tiny("gpt_neox").save_pretrained(str(tmp_path / "neox"), safe_serialization=True)
    op = open_model(tmp_path / "neox")
    assert op.provenance["adapter_path"] == "generic-blocks" and op.meta.family == "gpt_neox"
    ds = api.causal(op.model, EvalData.from_tokens(_ids()))
    assert ds.attrs["adapter_path"] == "generic-blocks" and ds.attrs["model_family"] == "gpt_neox"


def test_unhandled_architectures_are_refused_with_one_line(tmp_path):
    from depthlens.adapters.load import open_model

    bert = _tiny("bert", num_hidden_layers=2, max_position_embeddings=64, type_vocab_size=1)
    bert.save_pretrained(str(tmp_path / "bert"), safe_serialization=True)
    with pytest.raises(CheckpointError) as e:
        open_model(tmp_path / "bert")
    assert "\n" not in str(e.value) and "not a decoder-only causal LM" in str(e.value)
    import json

    d = tmp_path / "t5"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True, "num_layers": 2}))
    with pytest.raises(CheckpointError, match="no depthlens adapter|encoder-decoder"):
        open_model(d)

"""A foreign model's residual design is read from its block's structure: tiny random models of each family."""

from __future__ import annotations

import pytest
import torch

from depthlens.adapters.structure import classify


@pytest.mark.parametrize(
    "order, slug, name",
    [
        (["norm", "attn", "norm", "mlp"], "preln", "Pre-LN"),
        (["norm", "attn", "norm", "norm", "mlp", "norm"], "sandwich", "Sandwich-LN"),
        (["attn", "norm", "mlp", "norm"], "other", "other (Post-LN: a norm after each sublayer, none before)"),
        (["norm", "attn", "mlp"], "other", "other (norm attn mlp)"),  # parallel-style block: one shared norm
        (["norm", "attn", "norm", "mlp", "mlp"], "preln", "Pre-LN"),  # an MLP of two children (fc1, fc2)
        (["norm", "norm"], "other", "other (norm norm)"),
    ],
)
def test_classify(order, slug, name):
    assert classify(order) == (slug, name)


def _save(tmp_path, model, name):
    out = tmp_path / name
    model.save_pretrained(out)
    return out


def _tiny(family):
    import transformers as tf

    torch.manual_seed(0)
    common = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        head_dim=8,
    )
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    if family == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**common))
    if family == "gemma3":
        return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**common, sliding_window=8, query_pre_attn_scalar=8))
    if family == "opt_postln":
        return tf.OPTForCausalLM(
            tf.OPTConfig(
                vocab_size=64,
                hidden_size=16,
                ffn_dim=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=32,
                word_embed_proj_dim=16,
                do_layer_norm_before=False,
            )
        )
    raise AssertionError(family)


@pytest.mark.parametrize(
    "family, design, label",
    [
        ("llama", "preln", "Pre-LN"),
        ("qwen2", "preln", "Pre-LN"),
        ("gemma3", "sandwich", "Sandwich-LN"),
        ("opt_postln", "other", "other (Post-LN"),
    ],
)
def test_design_read_from_the_block(tmp_path, family, design, label):
    from depthlens.adapters.load import describe, open_model

    torch.set_num_threads(1)
    op = open_model(_save(tmp_path, _tiny(family), family))
    assert op.provenance["residual_design"] == design
    assert op.provenance["residual_design_name"].startswith(label)
    info = describe(op)
    assert info["design"] == design and info["design_name"].startswith(label)
    if design == "sandwich":  # the order the Gemma-3 block really runs: norms before and after each sublayer
        assert op.provenance["block_order"] == "norm attn norm | norm mlp norm"


@pytest.mark.parametrize("family", ["gemma3", "opt_postln"])
def test_generic_path_offers_the_chunked_head_when_exact(tmp_path, family):
    """Generic-blocks models: the LM head split at its matmul (so large vocabularies are walked in chunks) equals
    the model's own logits; a head followed by a logit transform (soft-capping) is not split."""
    import torch.nn.functional as F

    from depthlens.adapters.load import open_model
    from depthlens.models.protocol import unembedding_of

    torch.set_num_threads(1)
    hf = _tiny(family).eval()  # no dropout (OPT has some)
    model = open_model(_save(tmp_path, hf, family)).model
    assert getattr(model, "adapter_path", "") == "generic-blocks"
    tokens = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    u = unembedding_of(model)
    assert u is not None
    ctx = model.context(7)
    state = model.run_layers(model.embed(tokens, ctx), ctx)
    with torch.no_grad():
        expected = hf(input_ids=tokens, use_cache=False).logits  # the HF model's own forward
        torch.testing.assert_close(F.linear(u.hidden(state, ctx), u.weight, u.bias), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=1e-5)  # the adapter's whole forward
    if family == "gemma3":  # Gemma 2-style soft-capping after the head: no split offered
        model.hf.config.final_logit_softcapping = 0.5
        del model._unembedding
        assert unembedding_of(model) is None

"""The atlas's controls and labels (issue 33): the shuffled twin keeps every trained scale and nothing else of the
arrangement; the GGUF weights label is the header's file type."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.adapters.load import _file_type
from depthlens.adapters.twin import shuffled_twin
from depthlens.models import ModelConfig, build_model


def test_shuffled_twin_permutes_each_matrix_and_keeps_vectors():
    model = build_model(ModelConfig.debug("preln", n_layer=3), seed=0).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    twin = shuffled_twin(model, seed=1)
    after = model.state_dict()
    for k, v in before.items():
        torch.testing.assert_close(after[k], v)  # the model itself is untouched
    moved = 0
    for p, q in zip(model.parameters(), twin.parameters()):
        a, b = p.detach().numpy().ravel(), q.detach().numpy().ravel()
        np.testing.assert_array_equal(np.sort(a), np.sort(b))  # the same values, so the same scale
        if p.dim() < 2:
            np.testing.assert_array_equal(a, b)  # norm gains and biases kept as trained
        else:
            moved += int(not np.array_equal(a, b))
    assert moved == sum(p.dim() >= 2 for p in model.parameters())
    again = shuffled_twin(model, seed=1)
    for p, q in zip(twin.parameters(), again.parameters()):
        torch.testing.assert_close(p, q)  # seeded


def test_shuffled_twin_keeps_tied_weights_tied():
    from transformers import LlamaConfig, LlamaForCausalLM

    from depthlens.adapters.hf import wrap

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = wrap(LlamaForCausalLM(cfg).eval(), None)
    twin = shuffled_twin(model, seed=0)
    assert twin.hf.lm_head.weight is twin.hf.model.embed_tokens.weight
    assert not torch.equal(twin.hf.model.embed_tokens.weight, model.hf.model.embed_tokens.weight)
    torch.testing.assert_close(
        twin.hf.model.norm.weight, model.hf.model.norm.weight
    )  # the final norm's gain is a vector: kept


@pytest.mark.parametrize(
    "value, name", [(15, "Q4_K_M"), (3, "Q4_1"), (0, "F32"), (1, "F16"), (None, None), (9999, None), (True, None)]
)
def test_gguf_file_type_label(value, name):
    assert _file_type(value) == name


def test_gguf_header_reads_the_file_type(tmp_path):
    from depthlens.adapters.load import gguf_header
    from gguf_tiny import tiny_llama, write_tiny_gguf

    path = write_tiny_gguf(tiny_llama(seed=0), tmp_path / "tiny.gguf", quant="Q8_0")
    head = gguf_header(path)
    assert head["quantization"] == "Q8_0" and head["quantization_source"] == "general.file_type"

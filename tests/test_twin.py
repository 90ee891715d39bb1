"""The untrained twin (adapters/twin.py): same config and adapter path, the family's own initialisation."""

from __future__ import annotations

import pytest
import torch

from depthlens.adapters.hf import wrap
from depthlens.adapters.twin import untrained_twin
from depthlens.errors import DepthlensError
from gguf_tiny import tiny_llama
from helpers import debug_model


def test_native_twin_is_the_trainers_step0_model():
    trained = debug_model("hc", n_layer=4, seed=3)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)  # "training"
    twin = untrained_twin(trained, seed=3)
    ref = debug_model("hc", n_layer=4, seed=3)
    a, b = twin.state_dict(), ref.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not twin.training


def test_hf_twin_is_a_fresh_init_of_the_same_config_through_the_same_adapter():
    from transformers import LlamaForCausalLM

    hf = tiny_llama(seed=1)
    model = wrap(hf, tokenizer="tok")
    state = torch.get_rng_state()
    twin = untrained_twin(model, seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is untouched
    assert type(twin) is type(model) and twin.tokenizer == "tok" and twin.hf.config.to_dict() == hf.config.to_dict()
    torch.manual_seed(5)
    ref = LlamaForCausalLM(hf.config).state_dict()  # independent: the family's own init under that seed
    got, trained = twin.hf.state_dict(), hf.state_dict()
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in got)
    assert any(not torch.equal(got[k], trained[k]) for k in got if k.endswith("q_proj.weight"))
    x = torch.randint(0, hf.config.vocab_size, (1, 8))
    with torch.no_grad():
        assert not torch.allclose(twin(x), model(x))
    assert all(torch.equal(a, b) for a, b in zip(untrained_twin(model, seed=5).parameters(), twin.parameters()))


def test_twin_of_something_else_is_refused():
    with pytest.raises(DepthlensError, match="no untrained twin"):
        untrained_twin(torch.nn.Linear(2, 2))

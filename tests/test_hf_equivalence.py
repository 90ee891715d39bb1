"""Pre-LN and LNS depthlens models equal HF `LlamaForCausalLM` with the same weights (fp32, ~1e-5), and the
export -> load -> import round trip is lossless. HF's hidden_states[-1] is after the final norm, so h_L is
read with a hook. docs/foreign-models.md quotes the tolerance."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from depthlens.errors import CheckpointError
from depthlens.models import ModelConfig, build_model

TOL = dict(rtol=1e-5, atol=1e-5)


def _native(arch: str, seed: int = 0, **kw):
    """A debug depthlens model with every norm gain moved off 1 (so a misplaced or unscaled norm shows)."""
    m = build_model(ModelConfig.debug(arch, **kw), seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return m.eval()


def _tokens(vocab: int, B: int = 2, T: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def _hf_twin(native):
    """HF LlamaForCausalLM built offline from a config, weights copied by hand (independent of convert.py):
    renamed through the explicit key map; LNS gains of layer l (1-based) divided by sqrt(l)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from depthlens.adapters.base import invert, rename
    from depthlens.adapters.llama import LLAMA_KEYS

    c = native.config
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.d_model,
            intermediate_size=c.ffn_dim,
            num_hidden_layers=c.n_layer,
            num_attention_heads=c.n_head,
            num_key_value_heads=c.kv_heads,
            max_position_embeddings=c.max_seq_len,
            rope_theta=c.rope_theta,
            rms_norm_eps=c.norm_eps,
            tie_word_embeddings=c.tie_embeddings,
            bos_token_id=None,
            eos_token_id=None,
        )
    ).eval()
    sd = dict(native.state_dict())
    if c.tie_embeddings:
        sd.pop("lm_head.weight")
    if c.arch == "lns":
        for l in range(c.n_layer):
            for site in ("attn", "mlp"):
                sd[f"blocks.{l}.{site}.norm.weight"] = sd[f"blocks.{l}.{site}.norm.weight"] / math.sqrt(l + 1)
    missing, unexpected = hf.load_state_dict(rename(sd, invert(LLAMA_KEYS), what="test"), strict=False)
    assert not unexpected and missing == (["lm_head.weight"] if c.tie_embeddings else [])
    return hf


CASES = {
    "preln": dict(arch="preln"),
    "lns": dict(arch="lns"),
    "preln-gqa-tied": dict(arch="preln", n_kv_head=2, tie_embeddings=True),
    "lns-gqa": dict(arch="lns", n_kv_head=2, n_layer=6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_native_equals_hf_llama_logits_and_every_hidden_state(case):
    kw = dict(CASES[case])
    native = _native(kw.pop("arch"), **kw)
    hf = _hf_twin(native)
    L = native.n_layer
    toks = _tokens(native.config.vocab_size)
    h_L = []
    handle = hf.model.layers[-1].register_forward_hook(
        lambda m, a, out: h_L.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            out = hf(toks, output_hidden_states=True)
    finally:
        handle.remove()
    with torch.no_grad():
        logits, cache = native.run_with_cache(toks)
    torch.testing.assert_close(logits, out.logits, **TOL)
    assert len(out.hidden_states) == L + 1
    for l in range(L):  # hidden_states[l] = h_l, the input of layer l
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_pre"], out.hidden_states[l], **TOL)
    torch.testing.assert_close(cache["hook_resid_final"], h_L[0], **TOL)  # h_L before the final norm
    torch.testing.assert_close(native.norm(cache["hook_resid_final"]), out.hidden_states[L], **TOL)
    assert not torch.allclose(out.hidden_states[L], h_L[0], atol=1e-3)  # the pitfall: [-1] is post-norm


@pytest.mark.parametrize("arch", ["preln", "lns"])
def test_export_load_import_round_trip(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    from depthlens.adapters import export_llama, import_llama, load_any
    from depthlens.io import checkpoint

    native = _native(arch, n_kv_head=2)
    checkpoint.save(native, tmp_path / "ck")
    out = export_llama(tmp_path / "ck", tmp_path / "hf")
    side = json.loads((out / "depthlens_export.json").read_text())
    assert side["source_arch"] == arch and side["lns_folded"] == int(arch == "lns")
    toks = _tokens(native.config.vocab_size, seed=1)
    with torch.no_grad():
        ref = native(toks)
        hf = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
        torch.testing.assert_close(hf(toks).logits, ref, **TOL)
        adapted, meta = load_any(out)
        assert meta.kind == "hf" and meta.family == "llama"
        torch.testing.assert_close(adapted(toks), ref, **TOL)
        back = import_llama(out, tmp_path / "back", arch=arch)
        torch.testing.assert_close(back(toks), ref, **TOL)
    exact = arch == "preln"  # LNS folds a float factor in and out: equal to rounding
    for k, v in native.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-7)
    reloaded = checkpoint.load(tmp_path / "back")
    assert reloaded.config.arch == arch and reloaded.train["hf_model_type"] == "llama"
    with pytest.raises(CheckpointError, match="already exists"):
        export_llama(native, out)


def test_export_refuses_designs_without_a_llama_equivalent(tmp_path):
    from depthlens.adapters import export_llama

    with pytest.raises(CheckpointError, match="sandwich"):
        export_llama(build_model(ModelConfig.debug("sandwich")), tmp_path / "x")


def test_diagnostics_on_hf_export_equal_native(tmp_path):
    """depthlens-on-HF-export == depthlens-on-native for a Pre-LN checkpoint, for every diagnostic."""
    from depthlens.adapters import export_llama, load_any
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    native = _native("preln", seed=3, n_kv_head=2)
    adapted, _ = load_any(export_llama(native, tmp_path / "hf"))
    data = EvalData.from_tokens(_tokens(native.config.vocab_size, B=3, T=16, seed=2))
    runs = {
        "angular": (api.angular, {}, ["angular_distance"]),
        "causal": (
            api.causal,
            dict(variant="future", outputs=True),
            ["causal_score", "output_effect", "skip_delta_loss"],
        ),
        "permutation": (api.permutation, dict(layers="all"), None),
        "layer_skip_loss": (api.layer_skip_loss, {}, ["skip_delta_loss", "output_effect"]),
    }
    for name, (fn, opts, keys) in runs.items():
        a, b = fn(native, data, **opts), fn(adapted, data, **opts)
        for k in keys or [v for v in a.data_vars if a[v].dtype.kind == "f"]:
            np.testing.assert_allclose(b[k].values, a[k].values, rtol=1e-4, atol=2e-5, err_msg=f"{name}.{k}")

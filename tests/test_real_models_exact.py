"""The three real pretrained families of the atlas, exact against Hugging Face on their real weights.

Marked `real_models`: they need the GGUF files that `scripts/fetch-real-models.sh` downloads (about 840 MB), so
the default suite skips them (offline; the tiny random Gemma-3 and Qwen2 configs of tests/test_adapters.py and
tests/test_foreign_structure.py stand in). `scripts/real-model-atlas.sh` runs them first:

    DEPTHLENS_CACHE=... python -m pytest -m real_models tests/test_real_models_exact.py

For each model, through whichever adapter path its family takes (hand-mapped LLaMA / Qwen2, the generic block
path for Gemma-3):
* depthlens' layered forward (embed → run_layers → head) equals the HF model's own forward (fp32 logits);
* skipping one layer (keep = 0, the block-level skip of every diagnostic) equals an HF forward hook that hands
  the decoder layer's input through as its output;
* the residual design is read from the block structure (Gemma-3: Sandwich-LN; LLaMA, Qwen2: Pre-LN).
The largest logit difference per model is written to $DEPTHLENS_EXACTNESS_OUT (JSON) when that is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.real_models, pytest.mark.slow]

# name -> (residual design read from the block structure, adapter path)
MODELS = {
    "smollm2-135m-instruct": ("preln", "hand-mapped"),
    "gemma-3-270m": ("sandwich", "generic-blocks"),
    "qwen2.5-coder-0.5b-instruct": ("preln", "hand-mapped"),
}
TOL = 2e-4  # fp32 logits of up to 24 layers, summed in a different order than HF's fused paths


def _path(name: str) -> Path:
    cache = Path(os.environ.get("DEPTHLENS_CACHE") or Path.home() / ".cache" / "depthlens")
    return cache / "real-models" / f"{name}.gguf"


def _skip_hook(positions: slice):
    """HF forward hook (with kwargs): the decoder layer's output := its input hidden states on `positions`."""

    def hook(module, args, kwargs, output):
        h_in = args[0] if args else kwargs["hidden_states"]
        out = (output[0] if isinstance(output, tuple) else output).clone()
        out[:, positions] = h_in[:, positions]
        return (out, *output[1:]) if isinstance(output, tuple) else out

    return hook


@pytest.fixture(scope="module", params=list(MODELS))
def opened(request):
    path = _path(request.param)
    if not path.exists():
        pytest.skip(f"{path} not fetched (bash scripts/fetch-real-models.sh)")
    from depthlens.adapters.load import open_model

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return request.param, open_model(path)


def _record(name: str, key: str, value: float) -> None:
    out = os.environ.get("DEPTHLENS_EXACTNESS_OUT")
    if not out:
        return
    p = Path(out)
    doc = json.loads(p.read_text()) if p.exists() else {}
    doc.setdefault(name, {})[key] = value
    p.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _tokens(model, n: int = 2, t: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, int(model.config.vocab_size), (n, t), generator=g)


def test_design_label_and_adapter_path(opened):
    name, op = opened
    design, path = MODELS[name]
    prov = op.provenance
    assert prov["residual_design"] == design, (name, prov.get("block_order"))  # what info and every report say
    assert prov["adapter_path"] == path


def test_layered_forward_equals_the_hf_forward(opened):
    name, op = opened
    w = op.model
    toks = _tokens(w)
    with torch.no_grad():
        ref = w.hf(toks, use_cache=False).logits.float()
        ctx = w.context(toks.shape[1])
        out = w.head(w.run_layers(w.embed(toks, ctx), ctx), ctx).float()
    diff = float((out - ref).abs().max())
    _record(name, "max_abs_logit_diff", diff)
    _record(name, "max_abs_logit", float(ref.abs().max()))
    assert diff <= TOL * max(1.0, float(ref.abs().max())), diff


def test_skipping_a_layer_equals_an_hf_hook_skip(opened):
    name, op = opened
    w = op.model
    toks = _tokens(w, n=1)
    T = toks.shape[1]
    layer = w.n_layer // 2
    keep = torch.ones(1, T)
    keep[:, 1:] = 0  # every position but the first skips layer `layer`
    with torch.no_grad():
        ctx = w.context(T)
        skipped = w.head(w.run_layers(w.embed(toks, ctx), ctx, keep={layer: keep}), ctx).float()
        handle = w.layers[layer].register_forward_hook(_skip_hook(slice(1, None)), with_kwargs=True)
        try:
            ref = w.hf(toks, use_cache=False).logits.float()
        finally:
            handle.remove()
    diff = float((skipped - ref).abs().max())
    _record(name, "max_abs_logit_diff_skip", diff)
    assert diff <= TOL * max(1.0, float(ref.abs().max())), diff

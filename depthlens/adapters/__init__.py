"""Foreign models: run every depthlens diagnostic on Hugging Face checkpoints, and interoperate with
TransformerLens and nnsight.

    op = open_model("path")                 # depthlens dir, HF dir or GGUF file -> Opened(model, meta, tokenizer, provenance)
    model, meta = load_any("path")          # the same, as a pair
    model.n_layer, model.embed / run_layers / head, model.design   # the LayeredLM protocol either way

Pieces (heavy imports happen on first use):

    AdapterSpec                    base.py       module paths + explicit weight-key map of one HF family
    spec_for, supported_model_types families.py  the explicit list of families (gpt2, llama, mistral, qwen2/3)
    HFLayeredModel, load_hf        hf.py         LayeredLM over an HF *ForCausalLM (llama, mistral, qwen2, qwen3, gpt2)
    export_llama, import_llama     convert.py    depthlens preln/lns <-> HF LlamaForCausalLM directory
    Lens, from_bridge              lens.py       TransformerLens ActivationCache / patching / TransformerBridge
    causal_matrix_nnsight          nnsight_recipe.py   the causal score through nnsight.NNsight
    HFTokenizer, load_hf_tokenizer tokenizer.py  a foreign model's own tokenizer + its BOS convention
    Opened, open_model, opened_of  load.py       the one loader every CLI command and API call goes through
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "AdapterSpec": ("base", "AdapterSpec"),
    "spec_for": ("families", "spec_for"),
    "supported_model_types": ("families", "supported_model_types"),
    "HFLayeredModel": ("hf", "HFLayeredModel"),
    "load_hf": ("hf", "load_hf"),
    "export_llama": ("convert", "export_llama"),
    "import_llama": ("convert", "import_llama"),
    "Lens": ("lens", "Lens"),
    "from_bridge": ("lens", "from_bridge"),
    "attached_hooks": ("lens", "attached_hooks"),
    "causal_matrix_nnsight": ("nnsight_recipe", "causal_matrix_nnsight"),
    "HFTokenizer": ("tokenizer", "HFTokenizer"),
    "load_hf_tokenizer": ("tokenizer", "load_hf_tokenizer"),
    "Opened": ("load", "Opened"),
    "open_model": ("load", "open_model"),
    "opened_of": ("load", "opened_of"),
    "load_any": ("load", "load_any"),
    "ModelMeta": ("load", "ModelMeta"),
    "detect_kind": ("load", "detect_kind"),
}

__all__ = [*_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

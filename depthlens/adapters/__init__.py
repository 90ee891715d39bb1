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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

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
}

__all__ = ["load_any", "ModelMeta", "detect_kind", *_LAZY]


@dataclass
class ModelMeta:
    """What a caller (CLI, results file) needs to know about a loaded model besides the model itself."""

    kind: str  # "depthlens" | "hf" | "gguf"
    path: str  # the directory or GGUF file given
    name: str  # directory name: the `checkpoint` coordinate of results
    arch: str  # residual design slug; every HF family here is "preln"
    family: str  # "depthlens" or the HF family ("llama", "qwen2", "gpt2", ...)
    n_layer: int
    tokenizer: Any = None  # depthlens Tokenizer protocol object (encode/decode/bos_id/vocab_size), or None
    bos_id: int | None = None  # id at position 0 when the tokenizer adds one; None: position 0 is a real token
    checkpoint: Any = None  # depthlens.io.checkpoint.Checkpoint for native checkpoints
    config: dict[str, Any] = field(default_factory=dict)  # the raw config.json (for GGUF: the rebuilt HF config)
    provenance: dict[str, Any] = field(default_factory=dict)  # the loader's provenance attrs (load.Opened)

    def attrs(self) -> dict[str, Any]:
        """netCDF-safe provenance attributes (no None, no bool)."""
        a = {"model_kind": self.kind, "model_family": self.family, "checkpoint": self.name, "arch": self.arch,
             "n_layer": self.n_layer, "bos_id": -1 if self.bos_id is None else self.bos_id}
        if self.tokenizer is not None:
            a["tokenizer"] = getattr(self.tokenizer, "name", type(self.tokenizer).__name__)
        return a


def detect_kind(config: dict[str, Any]) -> str:
    """"depthlens" or "hf" from a parsed config.json; CheckpointError if it is neither."""
    if isinstance(config.get("model"), dict) or "depthlens_version" in config:
        return "depthlens"
    if "model_type" in config:
        return "hf"
    raise CheckpointError("config.json is neither a depthlens checkpoint config (has 'model') "
                          "nor a Hugging Face config (has 'model_type')")


def load_any(path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None) -> tuple[Any, ModelMeta]:
    """(model, meta) of a depthlens checkpoint, an HF directory or a GGUF file: `load.open_model` without
    the Opened record (the tokenizer is `meta.tokenizer`, the provenance `meta.provenance`).

    model implements the LayeredLM protocol (depthlens.models.protocol) and is a TransformerLens
    HookedRootModule with `blocks.{i}.hook_resid_*` hooks. HF models load in float32 unless `dtype` is given.
    Raises CheckpointError (one line) for anything missing, corrupt, unsafe or unsupported.
    """
    from .load import open_model

    op = open_model(path, device=device, dtype=dtype)
    return op.model, op.meta


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

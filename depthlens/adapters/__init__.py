"""Foreign models: run every depthlens diagnostic on Hugging Face checkpoints, and interoperate with
TransformerLens and nnsight.

    model, meta = load_any("path/to/dir")   # depthlens checkpoint or HF model dir, dispatched on config.json
    model.n_layer, model.embed / run_layers / head, model.design   # the LayeredLM protocol either way

Pieces (heavy imports happen on first use):

    AdapterSpec                    base.py       module paths + explicit weight-key map of one HF family
    spec_for, supported_model_types families.py  the explicit list of families (gpt2, llama, mistral, qwen2/3)
    HFLayeredModel, load_hf        hf.py         LayeredLM over an HF *ForCausalLM (llama, mistral, qwen2, qwen3, gpt2)
    export_llama, import_llama     convert.py    depthlens preln/lns <-> HF LlamaForCausalLM directory
    Lens, from_bridge              lens.py       TransformerLens ActivationCache / patching / TransformerBridge
    causal_matrix_nnsight          nnsight_recipe.py   the causal score through nnsight.NNsight
    HFTokenizer, load_hf_tokenizer tokenizer.py  a foreign model's own tokenizer + its BOS convention
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
}

__all__ = ["load_any", "ModelMeta", "detect_kind", "tokenizer_for", *_LAZY]


@dataclass
class ModelMeta:
    """What a caller (CLI, results file) needs to know about a loaded model besides the model itself."""

    kind: str  # "depthlens" | "hf"
    path: str  # the directory (or Hub id) given
    name: str  # directory name: the `checkpoint` coordinate of results
    arch: str  # residual design slug; every HF family here is "preln"
    family: str  # "depthlens" or the HF family ("llama", "qwen2", "gpt2", ...)
    n_layer: int
    tokenizer: Any = None  # depthlens Tokenizer protocol object (encode/decode/bos_id/vocab_size), or None
    bos_id: int | None = None  # id at position 0 when the tokenizer adds one; None: position 0 is a real token
    checkpoint: Any = None  # depthlens.io.checkpoint.Checkpoint for native checkpoints
    config: dict[str, Any] = field(default_factory=dict)  # the raw config.json

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


def load_any(path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None,
             allow_hub: bool = False) -> tuple[Any, ModelMeta]:
    """Load a depthlens checkpoint or an HF causal-LM directory -> (model_like, meta).

    model_like implements the LayeredLM protocol (depthlens.models.protocol) and is a TransformerLens
    HookedRootModule with `blocks.{i}.hook_resid_*` hooks. HF models load in float32 unless `dtype` is given.
    Raises CheckpointError (one line) for anything missing, corrupt or unsupported.
    """
    import torch

    from .hf import load_hf, read_hf_config

    p = Path(path)
    if allow_hub and not p.exists():
        model = load_hf(path, dtype=dtype or torch.float32, device=device, allow_hub=True)
        return model, _hf_meta(model, str(path), {})
    raw = read_hf_config(p)
    if detect_kind(raw) == "hf":
        model = load_hf(p, dtype=dtype or torch.float32, device=device)
        return model, _hf_meta(model, str(path), raw)
    from ..io import checkpoint

    ck = checkpoint.load(p, device=device, dtype=dtype)
    tok = tokenizer_for(p)
    meta = ModelMeta(kind="depthlens", path=str(path), name=p.name, arch=ck.config.arch, family="depthlens",
                     n_layer=ck.config.n_layer, tokenizer=tok, bos_id=getattr(tok, "bos_id", None),
                     checkpoint=ck, config=raw)
    return ck.model, meta


def tokenizer_for(path: str | os.PathLike) -> Any:
    """The tokenizer a checkpoint directory ships, or None: depthlens' own `tokenizer_config.json`
    ({"kind": ...}) for depthlens checkpoints, the HF tokenizer files (AutoTokenizer, local only) for HF
    model directories. Both satisfy depthlens' Tokenizer protocol (name, vocab_size, bos_id, encode)."""
    from .hf import read_hf_config

    p = Path(path)
    if detect_kind(read_hf_config(p)) == "hf":
        from .tokenizer import load_hf_tokenizer

        return load_hf_tokenizer(p)
    if not (p / "tokenizer_config.json").is_file():
        return None
    from ..data.tokenizers import load_tokenizer

    return load_tokenizer(p)  # a broken tokenizer is a DataError, never a silent fallback to another one


def _hf_meta(model: Any, path: str, raw: dict[str, Any]) -> ModelMeta:
    tok = model.tokenizer
    return ModelMeta(kind="hf", path=path, name=Path(path).name, arch=model.design.slug, family=model.spec.family,
                     n_layer=model.n_layer, tokenizer=tok, bos_id=getattr(tok, "bos_id", None), config=raw)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Write a model with some layers removed, in the input's own format.

* a Hugging Face directory -> a Hugging Face directory (`save_pretrained`, safetensors): the decoder's layer
  list keeps the other layers, renumbered 0..L-k-1 (each attention's `layer_idx` too), and the config's layer
  count (`num_hidden_layers`, `n_layer` or `num_layers`) and per-layer lists (`layer_types`) follow; the
  tokenizer files of the input directory are copied beside it. Plain `transformers` loads it.
* a GGUF file -> the same Hugging Face directory (transformers dequantised the file to float on load; no
  GGUF writer is used: the pruned weights are the float weights depthlens measured), with the tokenizer
  transformers reads from the GGUF file when it can.
* a depthlens checkpoint -> a depthlens checkpoint of the same config with `n_layer` = L - k, the kept blocks'
  weights renumbered; designs whose weights outside the blocks depend on the depth are refused (one line).

Removing layer l this way is the same model as the diagnostics' block-level skip (`keep[l] = 0`) for every
Pre-LN and Sandwich-LN family: the block is replaced by the identity.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "generation_config.json",
)
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def kept_layers(L: int, removed: Sequence[int]) -> list[int]:
    gone = {int(l) for l in removed}
    if not gone <= set(range(L)) or len(gone) >= L:
        raise CheckpointError(f"cannot remove layers {sorted(gone)} of a {L}-layer model")
    return [l for l in range(L) if l not in gone]


def prune_hf(hf: Any, layers: Any, removed: Sequence[int]) -> Any:
    """`hf` (a transformers model) with the layers `removed` taken out of its layer list `layers`, in place."""
    import torch.nn as nn

    kept = kept_layers(len(layers), removed)
    path = next((n for n, m in hf.named_modules() if m is layers), None)
    if path is None:
        raise CheckpointError("the model's layer list is not a submodule of its transformers model")
    new = nn.ModuleList([layers[l] for l in kept])
    for i, layer in enumerate(new):
        for m in layer.modules():
            if hasattr(m, "layer_idx"):
                setattr(m, "layer_idx", i)  # noqa: B010 - an attribute of transformers' attention modules
    hf.set_submodule(path, new)
    cfg = hf.config
    keys = [k for k in LAYER_COUNT_KEYS if isinstance(getattr(cfg, k, None), int)]
    if not keys:
        raise CheckpointError(f"model_type {cfg.model_type!r}: config states no layer count to change")
    for k in keys:
        setattr(cfg, k, len(kept))
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == len(layers):
        cfg.layer_types = [types[l] for l in kept]
    return hf


def write_hf(hf: Any, out: Path, source: Path) -> dict[str, Any]:
    """save_pretrained (safetensors) plus the input's tokenizer: copied files of an HF directory, or the
    tokenizer transformers builds from a GGUF file. Returns what was written."""
    if getattr(hf, "hf_quantizer", None) is not None and not source.is_dir():
        # a GGUF load leaves transformers' GGUF quantizer on the model, which refuses to serialise; the weights
        # are already dequantised floats, so they are saved as a plain float model
        hf.hf_quantizer = None
        hf.is_quantized = False
        if hasattr(hf.config, "quantization_config"):
            del hf.config.quantization_config
    hf.save_pretrained(str(out), safe_serialization=True)
    note: dict[str, Any] = {"format": "hf", "weights": "model.safetensors (float, save_pretrained)"}
    copied = []
    if source.is_dir():
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, out / name)
                copied.append(name)
        note["tokenizer"] = f"copied: {', '.join(copied)}" if copied else "none in the input directory"
    else:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name, local_files_only=True)
            tok.save_pretrained(str(out))
            note["tokenizer"] = "from the GGUF file (transformers AutoTokenizer)"
        except Exception as e:  # transformers raises many types for a tokenizer it cannot convert
            note["tokenizer"] = f"not written ({e.__class__.__name__}); use the GGUF file's tokenizer"
    return note


def prune_native(model: Any, removed: Sequence[int]) -> Any:
    """A depthlens model of the same config with n_layer = L - k holding the kept blocks' weights."""
    from ..models.model import build_model

    cfg = model.config
    kept = kept_layers(cfg.n_layer, removed)
    try:
        small_cfg = dataclasses.replace(cfg, n_layer=len(kept))
        small = build_model(small_cfg, seed=0)
    except Exception as e:  # the config's own validation (a depth-dependent option)
        raise CheckpointError(f"cannot prune a {cfg.arch} model to {len(kept)} layers: {e}") from None
    sd = {}
    for name, value in model.state_dict().items():
        if name.startswith("blocks."):
            l = int(name.split(".")[1])
            if l in kept:
                sd[f"blocks.{kept.index(l)}." + name.split(".", 2)[2]] = value
        else:
            sd[name] = value
    want = small.state_dict()
    bad = [k for k in want if k not in sd or tuple(sd[k].shape) != tuple(want[k].shape)]
    if bad or set(sd) - set(want):
        raise CheckpointError(
            f"design {cfg.arch!r} has depth-dependent weights ({(bad or sorted(set(sd) - set(want)))[0]}); "
            "pruning it is not supported"
        )
    small.load_state_dict(sd)
    return small.to(dtype=next(model.parameters()).dtype).eval()


def write_native(model: Any, out: Path, source: Path) -> dict[str, Any]:
    from ..io.checkpoint import save

    save(model, out)
    for extra in ("tokenizer_config.json", "tokenizer"):
        p = source / extra
        if p.is_file():
            shutil.copy2(p, out / extra)
        elif p.is_dir():
            shutil.copytree(p, out / extra)
    return {"format": "depthlens", "weights": "model.safetensors (depthlens checkpoint)"}

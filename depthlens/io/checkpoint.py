"""Checkpoints: a directory of safetensors + JSON. Never pickle.

    <dir>/config.json         {"depthlens_version": ..., "model": ModelConfig fields}
    <dir>/model.safetensors   the state dict (tied weights stored once)
    <dir>/train.json          optional: recipe, seed, data hash, steps, val loss
    <dir>/tokenizer_config.json  optional: the tokenizer's spec (depthlens.data.tokenizers; also under tokenizer/);
                              without it a byte-vocabulary (257) model gets the byte tokenizer, others none

`load` validates everything and raises `CheckpointError` with one clear line; `save` is atomic
(written to a temp directory next to the target, then renamed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, DepthlensError, SchemaError
from .jsonsafe import jsonable

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAIN = "train.json"


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model plus everything saved next to it."""

    path: Path
    model: Any  # DepthModel
    config: Any  # ModelConfig
    train: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None  # depthlens Tokenizer protocol object, or None (also `model.tokenizer`)

    @property
    def name(self) -> str:
        return self.path.name


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`; CheckpointError (one line) if missing, not JSON, or not an object."""
    from .files import read_json

    if not os.path.lexists(path):
        raise CheckpointError(f"{path.parent}: missing {path.name} ({what})")
    return read_json(path, what, error=CheckpointError)


def read_config(path: str | os.PathLike) -> Any:
    """The ModelConfig of a checkpoint directory (no weights read)."""
    from ..models.config import LEGACY_DEFAULTS, ModelConfig

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a directory (config.json + model.safetensors)")
    meta = read_json_object(path / CONFIG, "model config")
    raw = meta.get("model", meta)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path / CONFIG}: 'model' must be an object")
    # a field missing from an older checkpoint means the model was trained with the old behaviour
    raw = {**{k: v for k, v in LEGACY_DEFAULTS.items() if k not in raw}, **raw}
    try:
        return ModelConfig.from_dict(raw, path / CONFIG, prefix="model" if "model" in meta else "")
    except SchemaError as e:
        raise CheckpointError(str(e)) from None


def read_tokenizer(path: str | os.PathLike, vocab_size: int) -> Any:
    """The tokenizer saved with a checkpoint (in the directory or `tokenizer/`), bytes for the byte vocabulary,
    else None. A broken tokenizer file, or one whose ids do not fit the embedding, is an error, never a silent
    fallback."""
    from ..data.tokenizers import CONFIG_NAME, ByteTokenizer, load_tokenizer

    path = Path(path)
    for d in (path, path / "tokenizer"):
        if (d / CONFIG_NAME).is_file():
            tok = load_tokenizer(d)
            if tok.vocab_size > vocab_size:
                raise CheckpointError(
                    f"{d / CONFIG_NAME}: tokenizer {tok.name!r} has {tok.vocab_size} ids, "
                    f"the model's embedding only {vocab_size}"
                )
            return tok
    return ByteTokenizer() if vocab_size == ByteTokenizer.vocab_size else None


def load(path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None, check_finite: bool = True) -> Checkpoint:
    """Load and validate a checkpoint directory. Raises CheckpointError with a one-line message."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from ..models.model import DepthModel

    path = Path(path)
    config = read_config(path)
    meta = read_json_object(path / CONFIG, "model config")
    wpath = path / WEIGHTS
    if not wpath.exists():
        raise CheckpointError(f"{path}: missing {WEIGHTS}")
    try:
        tensors = load_file(str(wpath), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{wpath}: unreadable safetensors file (truncated or corrupt: {str(e).splitlines()[0]})"
        ) from None
    try:
        model = DepthModel(config)
    except ValueError as e:
        raise CheckpointError(f"{path / CONFIG}: {e}") from None
    expected = model.state_dict()
    if config.tie_embeddings:
        expected.pop("lm_head.weight", None)
        if "lm_head.weight" in tensors:  # loading would silently replace it by the embedding
            raise CheckpointError(
                f"{path / CONFIG}: field 'model.tie_embeddings' is true, but {WEIGHTS} holds its own "
                "lm_head.weight; expected false (untied) or a file without lm_head.weight"
            )
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        what = (
            (f"missing {len(missing)} tensor(s) e.g. {missing[0]}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected {len(extra)} tensor(s) e.g. {extra[0]}" if extra else "")
        )
        raise CheckpointError(
            f"{path}: weights do not match config.json ({config.arch}, L={config.n_layer}, d={config.d_model}): {what}"
        )
    for k, v in expected.items():
        if tensors[k].shape != v.shape:
            raise CheckpointError(
                f"{path}: tensor {k} has shape {tuple(tensors[k].shape)}, config implies {tuple(v.shape)}"
            )
        # finite in the dtype the model computes in: a float64 1e300 is finite as stored and +inf in fp32
        compute = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else v.dtype
        if check_finite and tensors[k].is_floating_point() and not bool(torch.isfinite(tensors[k].to(compute)).all()):
            raise CheckpointError(
                f"{path}: tensor {k} contains NaN or Inf values "
                f"(in {str(compute).removeprefix('torch.')}, the dtype the model computes in)"
            )
    model.load_state_dict(tensors, strict=not config.tie_embeddings)
    model.eval()
    if dtype is not None:
        model.to(dtype=dtype)
    model.to(device)
    train = read_json_object(path / TRAIN, "training record") if os.path.lexists(path / TRAIN) else {}
    if train:
        from .records import check_train_record

        try:
            check_train_record(train, path / TRAIN)
        except SchemaError as e:
            raise CheckpointError(str(e)) from None
    model.tokenizer = read_tokenizer(path, config.vocab_size)  # Lens(model).to_tokens / to_string use it
    return Checkpoint(path=path, model=model, config=model.config, train=train, meta=meta, tokenizer=model.tokenizer)


def save(
    model: Any,
    path: str | os.PathLike,
    *,
    train: dict[str, Any] | None = None,
    extra_files: Mapping[str, str | bytes] | None = None,
    overwrite: bool = False,
    owner: dict[str, str] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (depthlens.io.atomic.atomic_dir: temp dir in the same parent,
    then a recoverable swap). `overwrite` replaces only an existing depthlens checkpoint, never another
    directory or file; given `owner` (a trainer's run: {"run": <run dir>}), only one that owner made."""
    from safetensors.torch import save_file

    from .._version import __version__
    from .atomic import atomic_dir

    path = Path(path)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        sd.pop("lm_head.weight", None)
    for k, v in sd.items():
        if v.is_floating_point() and not bool(v.isfinite().all()):
            raise CheckpointError(f"refusing to save: tensor {k} contains NaN or Inf values")
    try:
        with atomic_dir(path, overwrite=overwrite, kinds=("checkpoint",), flag="overwrite=True", owner=owner) as tmp:
            save_file(sd, str(tmp / WEIGHTS), metadata={"format": "pt", "depthlens_version": __version__})
            meta = {"depthlens_version": __version__, "model": model.config.to_dict()}
            (tmp / CONFIG).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            if train is not None:
                (tmp / TRAIN).write_text(json.dumps(jsonable(train), indent=2, sort_keys=True) + "\n", encoding="utf-8")
            for name, content in (extra_files or {}).items():
                (tmp / name).write_bytes(content.encode() if isinstance(content, str) else content)
    except CheckpointError:
        raise
    except DepthlensError as e:
        raise CheckpointError(str(e)) from None
    return path

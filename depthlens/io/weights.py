"""Weight files before and after loading: what may be read, and what a loaded model must satisfy.

Checks shared by every source the loader opens (depthlens checkpoint, Hugging Face directory, GGUF file):

* `refuse_pickle(dir)`: weights come from safetensors or GGUF only. A directory holding only pickle files
  (`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`) is refused with one line saying how to convert it; nothing
  is unpickled, not even with `weights_only=True`.
* `safetensors_header(file)`: the tensor names, dtypes and shapes of a safetensors file, parsed from its
  JSON header only (8-byte length + JSON), so config sizes can be checked against the file *before* any
  model is allocated (`check_layer_count`, `check_shape`).
* `check_float_dtypes(header)`: only floating-point weights (F16, BF16, F32, F64).
* `check_finite(named_tensors)`: no NaN or Inf anywhere, after loading (GGUF is checked after dequantising).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .files import loads_json

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header
CONVERT_HINT = (
    'convert it once, in an environment you trust, with: python -c "from transformers import '
    "AutoModelForCausalLM as M; M.from_pretrained('DIR').save_pretrained('DIR', safe_serialization=True)\""
)

Header = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (safetensors dtype, shape)


def safetensors_files(directory: Path) -> list[Path]:
    """The safetensors files of a directory, sorted (the index's shards when it has one)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        from .checkpoint import read_json_object

        weight_map = read_json_object(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no 'weight_map'")
        files = []
        for name in sorted(set(map(str, weight_map.values()))):
            f = (directory / name).resolve()
            if f.parent != directory.resolve() or not f.is_file():
                raise CheckpointError(f"{index}: shard {name!r} is missing or outside the directory")
            files.append(f)
        return files
    return sorted(directory.glob("*.safetensors"))


def refuse_pickle(directory: Path) -> None:
    """CheckpointError (one line) if the directory has pickle weights but no safetensors weights."""
    if safetensors_files(directory) or any(directory.glob("*.gguf")):
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES and p.is_file())
    if pickles:
        raise CheckpointError(
            f"{directory}: weights only in pickle format ({', '.join(pickles[:3])}); depthlens never "
            f"unpickles files. To use it, {CONVERT_HINT.replace('DIR', str(directory))}"
        )


def safetensors_header(path: Path) -> Header:
    """{name: (dtype, shape)} from one safetensors file's header; no tensor data is read."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{path}: corrupt safetensors header (claims {n} bytes in a {size}-byte file)")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.__class__.__name__})") from None
    # strict: a duplicate tensor name would let this header and the loader read different entries
    meta = loads_json(raw, str(path), "safetensors header", error=CheckpointError)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header")
    out: Header = {}
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = str(info["dtype"]), tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CheckpointError(f"{path}: corrupt safetensors header entry {name!r}") from None
        if not 0 <= int(lo) <= int(hi) <= size - 8 - n:
            raise CheckpointError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
        out[name] = (dtype, shape)
    return out


def directory_header(directory: Path) -> Header:
    """The merged header of every safetensors file of a directory (CheckpointError when there is none)."""
    files = safetensors_files(directory)
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors weights")
    out: Header = {}
    for f in files:
        out.update(safetensors_header(f))
    return out


def check_float_dtypes(header: Mapping[str, tuple[str, tuple[int, ...]]], where: str | os.PathLike) -> None:
    """Refuse a weight file holding a tensor that is not floating point (ints, bools, fp8)."""
    for name, (dtype, _) in header.items():
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{where}: tensor {name} has dtype {dtype}; depthlens analyses floating-point "
                f"weights only ({', '.join(FLOAT_DTYPES)})"
            )


def layer_indices(names: Iterable[str], prefix: str) -> set[int]:
    """The layer indices i of names starting with `prefix` + "{i}." (e.g. "model.layers.")."""
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    return {int(m.group(1)) for m in map(pat.match, names) if m}


def layer_prefixes(names: Iterable[str]) -> set[str]:
    """Every "<path>." that is followed by a layer index in some tensor name ("model.layers.", "gpt_neox.layers.")."""
    pat = re.compile(r"^(.*?\.)\d+\.")
    return {m.group(1) for m in map(pat.match, names) if m}


def check_layer_count(
    n_config: int, names: Iterable[str], prefix: str, where: str | os.PathLike, field: str = "n_layer"
) -> None:
    """The config's layer count must be the number of layers the weight file holds (checked before building
    the model, so a config claiming 200,000 layers fails here instead of allocating them)."""
    found = layer_indices(names, prefix)
    if n_config != len(found) or (found and max(found) != len(found) - 1):
        raise CheckpointError(
            f"{where}: config says {field}={n_config}, the weight file holds {len(found)} layer(s) under {prefix!r}"
        )


def check_shape(
    header: Mapping[str, tuple[str, tuple[int, ...]]],
    name: str,
    expected: tuple[int, ...],
    where: str | os.PathLike,
    what: str,
) -> None:
    """The tensor `name` (when present) must have the shape the config implies."""
    if name in header and tuple(header[name][1]) != tuple(expected):
        raise CheckpointError(
            f"{where}: tensor {name} has shape {tuple(header[name][1])}, config ({what}) implies {tuple(expected)}"
        )


def check_finite(named: Iterable[tuple[str, Any]], where: str | os.PathLike) -> None:
    """Refuse a loaded model with a NaN/Inf weight or a non-float parameter (one line naming the tensor)."""
    import torch

    for name, t in named:
        if not t.is_floating_point():
            raise CheckpointError(
                f"{where}: weight {name} has dtype {str(t.dtype).removeprefix('torch.')}; "
                "depthlens analyses floating-point weights only"
            )
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{where}: weight {name} contains NaN or Inf values")

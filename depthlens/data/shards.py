"""Token shards in the modded-nanogpt format, a packed-sequence dataset over them, and seeded batch order.

Shard file layout (modded-nanogpt `data/fineweb.py`, so the public pre-tokenized FineWeb-Edu GPT-2
shards load unchanged):

    int32[256] header  {0: 20240520 (magic), 1: version, 2: n_tokens}, little-endian
    uint16[n_tokens]   token ids (version 1), or
    uint32[n_tokens]   token ids (version 2: vocabularies over 65,536 ids - Llama 3, Qwen, Gemma)

Version 1 is modded-nanogpt's own format; version 2 is the same layout with 4-byte ids, written only when an id
does not fit 2 bytes, so every shard says its own width and a dataset of uint16 shards reads as before.

Data order is a pure function of (data_seed, step): global sample g = step·B + i is sequence
`perm(seed, epoch)[g mod n_sequences]` with epoch = g // n_sequences. Ranks and micro-batches take
contiguous slices of a step's ids, so the order is independent of world size and accumulation, and a
resume needs only the step.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.errors import DataError

SHARD_MAGIC = 20240520
SHARD_VERSION = 1  # uint16 ids (modded-nanogpt)
SHARD_VERSION_U32 = 2  # uint32 ids: large vocabularies
HEADER_INTS = 256  # int32 slots; only the first three are used
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")  # uint16: ids < 65,536 (GPT-2's 50,257 fits)
TOKEN_DTYPE_U32 = np.dtype("<u4")  # uint32: any vocabulary (Gemma 3's 262,144 ids)
SHARD_DTYPES: dict[int, np.dtype[Any]] = {SHARD_VERSION: TOKEN_DTYPE, SHARD_VERSION_U32: TOKEN_DTYPE_U32}


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest shard id type that holds every id of a `vocab_size` vocabulary."""
    return TOKEN_DTYPE if vocab_size <= 1 + int(np.iinfo(TOKEN_DTYPE).max) else TOKEN_DTYPE_U32


MANIFEST_NAME = "manifest.json"
_UNHASHED_MANIFEST_KEYS = ("data_hash", "versions")  # the hash itself, and software versions that do not change data


# ---------------------------------------------------------------------------------------------
# single shard I/O


def write_shard(
    path: str | os.PathLike, tokens: Iterable[int] | np.ndarray, dtype: np.dtype | str | None = None
) -> Path:
    """Write `tokens` as one shard, atomically (temp file in the same dir + os.replace).

    `dtype` (uint16 or uint32) fixes the id width; None picks uint16 when every id fits, else uint32.
    Returns the path. Raises DataError if an id does not fit the width.
    """
    path = Path(path)
    arr = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens))
    if arr.ndim != 1:
        raise DataError(f"{path}: tokens must be a 1-D sequence, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise DataError(f"{path}: token ids must be >= 0, got {arr.min()}")
    if dtype is None:
        dtype = token_dtype(int(arr.max()) + 1 if arr.size else 0)
    dtype = np.dtype(dtype).newbyteorder("<")
    if dtype not in SHARD_DTYPES.values():
        raise DataError(f"{path}: shard ids are uint16 or uint32, not {dtype}")
    if arr.size and arr.max() > np.iinfo(dtype).max:
        raise DataError(
            f"{path}: token ids must be in [0, {np.iinfo(dtype).max}] for {dtype.name} shards, "
            f"got range [{arr.min()}, {arr.max()}]"
        )
    version = next(v for v, d in SHARD_DTYPES.items() if d == dtype)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, version, arr.size)
    payload = header.tobytes() + arr.astype(dtype).tobytes()
    atomic_write_bytes(path, payload)
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` (parents created) via a temp file, fsync'ed, so readers never see a partial file."""
    from depthlens.io.atomic import atomic_write_bytes as _write

    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, data, fsync=True)


def read_shard_header(path: str | os.PathLike) -> int:
    """Validate a shard's header and size; return its token count. DataError names the file and the fault."""
    return _shard_header(path)[0]


def _shard_header(path: str | os.PathLike) -> tuple[int, np.dtype]:
    """(token count, id dtype) of a validated shard."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: shard file not found")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataError(f"{path}: truncated shard header ({size} bytes, expected at least {HEADER_BYTES})")
    with open(path, "rb") as f:
        magic, version, n_tokens = np.frombuffer(f.read(12), dtype="<i4")
    if magic != SHARD_MAGIC:
        raise DataError(f"{path}: not a token shard (magic {magic}, expected {SHARD_MAGIC})")
    if version not in SHARD_DTYPES:
        raise DataError(
            f"{path}: unsupported shard version {version} (expected one of {sorted(SHARD_DTYPES)}: "
            "1 = uint16 ids, 2 = uint32 ids)"
        )
    dtype = SHARD_DTYPES[int(version)]
    expected = HEADER_BYTES + int(n_tokens) * dtype.itemsize
    if n_tokens < 0 or size != expected:
        what = "truncated" if size < expected else "oversized"
        raise DataError(
            f"{path}: {what} shard ({size} bytes, header says {n_tokens} {dtype.name} tokens = {expected} bytes)"
        )
    return int(n_tokens), dtype


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """Token ids of one shard as a read-only uint16 or uint32 array [n_tokens] (a memmap; nothing is loaded
    eagerly)."""
    n_tokens, dtype = _shard_header(path)
    if n_tokens == 0:  # np.memmap cannot map zero bytes
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n_tokens,))


# ---------------------------------------------------------------------------------------------
# hashing


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no whitespace) for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def data_hash(shard_paths: Sequence[str | os.PathLike], manifest: Mapping[str, Any] | None = None) -> str:
    """SHA-256 over the shards (in the given order: name, size, bytes) and the manifest.

    The manifest's own `data_hash` and its `versions` block are left out, so the hash names the data,
    not the software that wrote it.
    """
    h = hashlib.sha256()
    for p in map(Path, shard_paths):
        h.update(f"{p.name}\0{p.stat().st_size}\0".encode())
        h.update(bytes.fromhex(sha256_file(p)))
    if manifest is not None:
        h.update(canonical_json({k: v for k, v in manifest.items() if k not in _UNHASHED_MANIFEST_KEYS}))
    return h.hexdigest()


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The directory's manifest.json, or None if it has none."""
    from depthlens.errors import SchemaError
    from depthlens.io.files import read_json
    from depthlens.schema import validate

    path = Path(directory) / MANIFEST_NAME
    if not os.path.lexists(path):
        return None
    manifest = read_json(path, "a shard manifest", error=DataError)
    try:
        validate(_manifest_schema(), manifest, path)
    except SchemaError as e:
        raise DataError(str(e)) from None
    return manifest


def _shard_name(name: str) -> str:
    """A manifest names files of its own directory, nothing else."""
    if "/" in name or "\\" in name or name in ("", ".", "..") or "\0" in name:
        raise ValueError("a file name of the shard directory itself (a path would point outside the shard directory)")
    return name


@lru_cache(maxsize=1)
def _manifest_schema() -> Any:
    """manifest.json (written by `prepare`, or a foreign one): splits of shard files, the tokenizer they hold."""
    from typing import Annotated

    from annotated_types import Ge, Gt
    from pydantic import AfterValidator, BaseModel, ConfigDict, Field

    class Shard(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")
        file: Annotated[str, AfterValidator(_shard_name)]  # a file of the manifest's own directory
        n_tokens: Annotated[int, Ge(0)] | None = None

    class Split(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")
        shards: list[Shard]  # in stream order
        n_tokens: Annotated[int, Ge(0)] | None = None

    class ShardTokenizer(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")
        name: str | None = None  # must match the tokenizer a run or an eval uses
        vocab_size: Annotated[int, Gt(0)] | None = None
        bos_id: Annotated[int, Ge(0)] | None = None  # the document delimiter the shards hold

    class Manifest(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")
        splits: dict[str, Split] = Field(default_factory=dict)
        tokenizer: ShardTokenizer | str | None = None
        data_hash: str | None = None

    return Manifest


def confined(directory: Path, name: str) -> Path:
    """directory / name, refused (DataError) unless it resolves to a file inside `directory`: a manifest
    cannot point the reader at other files (absolute paths, `..`, symlinks out of the directory)."""
    root = directory.resolve()
    path = (directory / name).resolve()
    if path.parent != root and root not in path.parents:
        raise DataError(f"{directory / MANIFEST_NAME}: shard path {name!r} points outside the shard directory")
    return path


# ---------------------------------------------------------------------------------------------
# batch order


@lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, n_sequences: int) -> np.ndarray:
    """The seeded order of sequence slots for one epoch (read-only, cached: consecutive steps reuse it)."""
    perm = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(n_sequences)
    perm.flags.writeable = False
    return perm


def sample_indices(start: int, stop: int, seed: int, n_sequences: int) -> np.ndarray:
    """Sequence ids of global samples start..stop-1 (int64 [stop − start]); epoch-wise reshuffled."""
    if n_sequences <= 0:
        raise DataError("dataset has no complete sequence at this seq_len")
    g = np.arange(start, stop, dtype=np.int64)
    out = np.empty_like(g)
    for epoch in np.unique(g // n_sequences):
        sel = g // n_sequences == epoch
        out[sel] = _epoch_permutation(seed, int(epoch), n_sequences)[g[sel] % n_sequences]
    return out


def batch_indices(step: int, global_batch: int, seed: int, n_sequences: int) -> np.ndarray:
    """Sequence ids of global step `step` (int64 [global_batch]): samples step·B .. step·B + B − 1.

    Depends only on (seed, step, global_batch, n_sequences). Rank r of W with micro-batch m and
    accumulation step a takes `ids[(r·A + a)·m : (r·A + a + 1)·m]`; any such split covers the same ids.
    """
    return sample_indices(step * global_batch, (step + 1) * global_batch, seed, n_sequences)


# ---------------------------------------------------------------------------------------------
# dataset


class TokenDataset:
    """The concatenation of shards, cut into packed windows of seq_len + 1 tokens.

    Window i covers stream tokens [i·T, i·T + T] (inputs = window[:-1], targets = window[1:]);
    consecutive windows share one boundary token and may span two shards.
    """

    def __init__(self, shard_paths: Sequence[str | os.PathLike], manifest: Mapping[str, Any] | None = None):
        if not shard_paths:
            raise DataError("no token shards given")
        self.paths = [Path(p) for p in shard_paths]
        self.manifest = dict(manifest) if manifest is not None else None
        self._shards = [read_shard(p) for p in self.paths]
        self.vocab_size: int | None = None  # set by `require_vocab`: every window read is then checked
        # starts[k] = stream offset of shard k; starts[-1] = total tokens
        self._starts = np.concatenate([[0], np.cumsum([len(s) for s in self._shards])]).astype(np.int64)

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, split: str = "train") -> TokenDataset:
        """The `split` shards of a prepared directory: as listed in manifest.json, else `*{split}_<digits>.bin`
        sorted (matches our `train_000.bin` and the FineWeb-Edu `finewebedu_train_000001.bin`)."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        if manifest is not None and not isinstance(manifest, dict):
            raise DataError(f"{directory / MANIFEST_NAME}: expected a JSON object")
        splits = (manifest or {}).get("splits", {})
        if isinstance(splits, dict) and split in splits:
            try:
                names = [str(s["file"]) for s in splits[split]["shards"]]
            except (TypeError, KeyError):
                raise DataError(
                    f"{directory / MANIFEST_NAME}: malformed '{split}' split (needs shards[].file)"
                ) from None
        else:
            names = sorted(p.name for p in directory.glob(f"*{split}_[0-9]*.bin"))
        if not names:
            raise DataError(f"{directory}: no '{split}' shards")
        return cls([confined(directory, n) for n in names], manifest)

    @property
    def n_tokens(self) -> int:
        return int(self._starts[-1])

    def n_sequences(self, seq_len: int) -> int:
        """How many full windows of seq_len + 1 tokens the stream holds."""
        return max(0, (self.n_tokens - 1) // seq_len)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Stream tokens [start, stop) as int64, gathered across shard boundaries."""
        if not 0 <= start <= stop <= self.n_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.n_tokens})")
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        parts, pos, k = [], start, first
        while pos < stop:
            lo = pos - self._starts[k]
            hi = min(stop, self._starts[k + 1]) - self._starts[k]
            parts.append(np.asarray(self._shards[k][lo:hi], dtype=np.int64))
            pos, k = self._starts[k] + hi, k + 1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def sequence(self, i: int, seq_len: int) -> np.ndarray:
        """Window i: int64 [seq_len + 1]."""
        n = self.n_sequences(seq_len)
        if not 0 <= i < n:
            raise IndexError(f"sequence {i} out of range [0, {n}) at seq_len={seq_len}")
        return self.tokens(i * seq_len, i * seq_len + seq_len + 1)

    def batch(self, ids: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        """Windows `ids` stacked: int64 [len(ids), seq_len + 1] (ids checked against `vocab_size` once set)."""
        if not len(ids):
            return np.zeros((0, seq_len + 1), np.int64)
        out = np.stack([self.sequence(int(i), seq_len) for i in ids])
        if self.vocab_size is not None and out.size and int(out.max()) >= self.vocab_size:
            raise self._too_large(int(out.max()))
        return out

    SCAN_TOKENS = 1 << 26  # `require_vocab` reads every id of a dataset up to this size (64 Mi tokens: < 1 s)

    def require_vocab(self, vocab_size: int) -> None:
        """Refuse ids at or above `vocab_size` (a model's embedding has no row for them: training ended in an
        IndexError). A dataset of up to `SCAN_TOKENS` ids is read whole now, before any work; a larger one is
        checked window by window as `batch` reads it (a few ids per batch). DataError names the shards."""
        self.vocab_size = int(vocab_size)
        if self.n_tokens <= self.SCAN_TOKENS:
            hi = max((int(s.max()) for s in self._shards if len(s)), default=-1)
            if hi >= self.vocab_size:
                raise self._too_large(hi)

    def _too_large(self, hi: int) -> DataError:
        where = self.paths[0].parent if len(self.paths) > 1 else self.paths[0]
        return DataError(
            f"{where}: token id {hi} is outside the model's vocabulary of {self.vocab_size} ids "
            "(shards of another tokenizer?)"
        )

    def step_batch(self, step: int, global_batch: int, seq_len: int, seed: int) -> np.ndarray:
        """The whole global batch of `step`: int64 [global_batch, seq_len + 1] (see `batch_indices`)."""
        return self.batch(batch_indices(step, global_batch, seed, self.n_sequences(seq_len)), seq_len)

    def data_hash(self) -> str:
        """SHA-256 over this dataset's shard bytes + its manifest (see `data_hash`)."""
        return data_hash(self.paths, self.manifest)

    def __repr__(self) -> str:
        return f"TokenDataset({len(self.paths)} shards, {self.n_tokens:,} tokens)"

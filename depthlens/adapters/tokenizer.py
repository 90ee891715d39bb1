"""Foreign tokenizers: a model's own tokenizer files, behind depthlens' `Tokenizer` protocol.

`load_hf_tokenizer(dir)` uses `transformers.AutoTokenizer.from_pretrained(dir, local_files_only=True)`
when the directory holds tokenizer files, and records the BOS convention the tokenizer applies by
default, because the diagnostics exclude position 0 on the assumption that it is BOS:

* LLaMA / Mistral tokenizers prepend `<s>`: `adds_bos=True`, `bos_id` is its id;
* Qwen2/Qwen3 (and GPT-2) prepend nothing: `adds_bos=False`, `bos_id=None`, so position 0 is the first
  real token (docs/concepts.md#eval-data).

`encode` never adds special tokens (the depthlens corpus builder prepends `bos_id` itself when it is not
None); `to_tokens` follows the tokenizer's own default, like TransformerLens.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# the small JSON files of a tokenizer, read strictly before transformers reads them (tokenizer.json, up to tens of
# MB, is left to the Rust `tokenizers` parser)
STRICT_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json")


class HFTokenizer:
    """A transformers tokenizer seen through depthlens' Tokenizer protocol (name, vocab_size, bos_id,
    encode, decode, save) plus `adds_bos` and TransformerLens-style `to_tokens`."""

    def __init__(self, tok: Any, name: str):
        self.tok = tok
        self.name = name
        self.vocab_size = len(tok)
        with_special = tok("a")["input_ids"]
        plain = tok("a", add_special_tokens=False)["input_ids"]
        bos = tok.bos_token_id
        self.adds_bos = bos is not None and len(with_special) > len(plain) and with_special[0] == bos
        self.bos_id: int | None = bos if self.adds_bos else None

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def save(self, directory: str | os.PathLike) -> Path:
        self.tok.save_pretrained(str(directory))
        return Path(directory)

    def to_tokens(
        self, text: str | list[str], prepend_bos: bool | None = None, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """(B, T) long ids, right-padded with the pad (else EOS, else 0) id; BOS per `prepend_bos`
        (None: the tokenizer's default)."""
        texts = [text] if isinstance(text, str) else list(text)
        bos = self.adds_bos if prepend_bos is None else prepend_bos
        if bos and self.tok.bos_token_id is None:
            raise ValueError(f"tokenizer {self.name!r} has no BOS token")
        rows = [([self.tok.bos_token_id] if bos else []) + self.encode(t) for t in texts]
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.tok.eos_token_id or 0)
        T = max(len(r) for r in rows)
        return torch.tensor([r + [pad] * (T - len(r)) for r in rows], dtype=torch.long, device=device)

    def describe(self) -> dict[str, Any]:
        """What results should record about tokenisation."""
        return {
            "tokenizer": self.name,
            "vocab_size": self.vocab_size,
            "adds_bos": int(self.adds_bos),
            "bos_id": -1 if self.bos_id is None else self.bos_id,
        }


def has_tokenizer_files(path: str | os.PathLike) -> bool:
    return any((Path(path) / f).exists() for f in TOKENIZER_FILES)


def load_hf_tokenizer(path: str | os.PathLike) -> HFTokenizer | None:
    """The directory's own tokenizer, or None when it ships no tokenizer files."""
    if not has_tokenizer_files(path):
        return None
    from transformers import AutoTokenizer

    from ..io.files import read_json

    for name in STRICT_FILES:  # transformers reads them with json.load: a key twice would silently be the last
        if (Path(path) / name).exists():
            read_json(Path(path) / name, "a tokenizer file", error=CheckpointError)

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # a broken tokenizer file must not look like a traceback to the CLI
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        raise CheckpointError(f"{path}: cannot load tokenizer ({e.__class__.__name__}: {first})") from None
    return HFTokenizer(tok, name=f"hf-{Path(path).resolve().name}-{_files_sha(path)}")


def _files_sha(path: str | os.PathLike) -> str:
    """12 hex digits of SHA-256 over the tokenizer files: the name keys caches (eval corpora) per tokenizer."""
    h = hashlib.sha256()
    for f in TOKENIZER_FILES:
        p = Path(path) / f
        if p.is_file():
            h.update(f.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]

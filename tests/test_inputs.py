"""Eval inputs: token shards read as they are (no foreign BOS), shard tokenizer checks and provenance,
confined manifest paths; every result stores its eval token ids and re-runs on them reproduce it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import depthlens
from depthlens.data.shards import write_shard
from depthlens.errors import DataError
from depthlens.models import ModelConfig, build_model
from depthlens.runtime.evaldata import EvalData, load_eval_data
from depthlens.studies import api

V = 1000  # > 257: a byte-tokenizer BOS (256) would be a real, wrong token here


def _shards(root, stream, tokenizer=None, files=None):
    root.mkdir(parents=True, exist_ok=True)
    write_shard(root / "val_000.bin", stream)
    if tokenizer is not None or files is not None:
        man = {"splits": {"val": {"shards": [{"file": f} for f in (files or ["val_000.bin"])]}}}
        if tokenizer is not None:
            man["tokenizer"] = tokenizer
        (root / "manifest.json").write_text(json.dumps(man))
    return root


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("bigv")
    ckpt = depthlens.save(build_model(ModelConfig.debug("preln", vocab_size=V, max_seq_len=64), seed=0), root / "m")
    stream = np.random.default_rng(0).integers(0, V, 16 * 20).astype(np.int64)
    stream[::40] = 999  # the shard's own document delimiter
    shards = _shards(root / "shards", stream, tokenizer={"name": "bpe-abc", "vocab_size": V, "bos_id": 999})
    return ckpt, shards, stream


def test_shard_ids_reach_the_model_unchanged(big_vocab):
    ckpt, shards, stream = big_vocab
    from depthlens.adapters.load import open_model

    model = open_model(ckpt).model
    seen = []
    handle = model.embed_tokens.register_forward_hook(lambda mod, args, out: seen.append(args[0].clone()))
    try:
        ds = api.angular(model, shards, n_seq=4, seq_len=16, seed=0)
    finally:
        handle.remove()
    windows = stream[: (len(stream) // 16) * 16].reshape(-1, 16)
    fed = torch.cat(seen).numpy()
    assert fed.shape[1] == 16 and len(fed) >= 4
    for row in fed:  # every row the model saw is a verbatim 16-token cut of the shard stream
        assert any(np.array_equal(row, w) for w in windows)
    assert not (fed[:, 0] == 256).all()
    stored = ds["eval_tokens"].values
    assert all(any(np.array_equal(r, w) for w in windows) for r in stored)
    assert ds.attrs["shard_tokenizer"] == "bpe-abc" and ds.attrs["shard_bos_id"] == 999
    assert ds.attrs["eval_bos"] == 0 and ds.attrs["tokenizer"] == "bpe-abc"


def test_shards_with_a_mismatched_tokenizer_are_refused(tmp_path):
    from depthlens.data.tokenizers import ByteTokenizer

    stream = np.arange(400) % 250
    gpt2 = {"name": "gpt2", "vocab_size": 50257, "bos_id": 50256}
    with pytest.raises(DataError, match="tokenized with 'gpt2'.*model's tokenizer is 'bytes'"):
        load_eval_data(_shards(tmp_path / "a", stream, tokenizer=gpt2), ByteTokenizer(), n_seq=2, seq_len=16)
    # the same vocabulary and BOS under another depthlens name is still another tokenizer
    other = {"name": "bpe-123", "vocab_size": 257, "bos_id": 256}
    with pytest.raises(DataError, match="name"):
        load_eval_data(_shards(tmp_path / "b", stream, tokenizer=other), ByteTokenizer(), n_seq=2, seq_len=16)
    same = {"name": "bytes", "vocab_size": 257, "bos_id": 256}
    ev = load_eval_data(_shards(tmp_path / "c", stream, tokenizer=same), ByteTokenizer(), n_seq=2, seq_len=16)
    assert ev.meta["shard_tokenizer"] == "bytes"
    # unknown on either side: accepted, and provenance says so
    ev = load_eval_data(_shards(tmp_path / "d", stream), None, n_seq=2, seq_len=16)
    assert ev.provenance()["shard_tokenizer"] == "unknown" and ev.provenance()["shard_bos_id"] == -1


def test_manifest_paths_stay_inside_the_shard_dir(tmp_path):
    write_shard(tmp_path / "outside.bin", np.arange(100))
    for bad in ("../outside.bin", str(tmp_path / "outside.bin")):
        d = _shards(tmp_path / f"s{len(bad)}", np.arange(100), files=[bad])
        with pytest.raises(DataError, match="outside the shard directory"):
            load_eval_data(d, None, n_seq=2, seq_len=16)
    d = tmp_path / "link"
    d.mkdir()
    (d / "val_000.bin").symlink_to(tmp_path / "outside.bin")
    (d / "manifest.json").write_text(json.dumps({"splits": {"val": {"shards": [{"file": "val_000.bin"}]}}}))
    with pytest.raises(DataError, match="outside the shard directory"):
        load_eval_data(d, None, n_seq=2, seq_len=16)


def test_cli_data_shards_on_a_big_vocabulary(big_vocab, tmp_path):
    from typer.testing import CliRunner

    from depthlens.cli import app

    ckpt, shards, stream = big_vocab
    out = tmp_path / "c.nc"
    r = CliRunner().invoke(
        app,
        [
            "causal",
            str(ckpt),
            "--data",
            str(shards),
            "--n-seq",
            "3",
            "--seq-len",
            "16",
            "--n-boot",
            "0",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    import xarray as xr

    with xr.open_dataset(out) as ds:
        toks = ds["eval_tokens"].values
        assert ds.attrs["shard_bos_id"] == 999
    windows = stream[: (len(stream) // 16) * 16].reshape(-1, 16)
    assert all(any(np.array_equal(r, w) for w in windows) for r in toks)


# --- stored eval ids -----------------------------------------------------------------------------------


def test_every_result_stores_its_eval_ids_and_reruns_reproduce_it(tmp_path):
    from depthlens.io.dataset import read_netcdf, write_netcdf

    model = build_model(ModelConfig.debug("preln", n_layer=4), seed=3).eval()
    data = EvalData.from_tokens(torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(1)))
    results = {
        "causal": api.causal(model, data),
        "permutation": api.permutation(model, data, layers="all"),
        "angular": api.angular(model, data),
    }
    for name, ds in results.items():
        write_netcdf(ds, tmp_path / f"{name}.nc")
        back = read_netcdf(tmp_path / f"{name}.nc")
        again = EvalData.from_dataset(back)
        assert torch.equal(again.tokens, data.tokens) and again.sha256 == back.attrs["eval_data_sha256"]
    # an independent re-run on the stored ids reproduces the result
    back = read_netcdf(tmp_path / "permutation.nc")
    rerun = api.permutation(model, EvalData.from_dataset(back), layers="all")
    np.testing.assert_allclose(rerun["perm_abs"].values, back["perm_abs"].values, rtol=1e-6, atol=1e-7)
    # and the clean loss it records is the plain teacher-forced NLL of those ids (no depthlens engine):
    # predictions from positions 1..T-2 (position 0, BOS or not, is never measured), per sequence, then mean
    toks = torch.as_tensor(back["eval_tokens"].values, dtype=torch.long)
    with torch.no_grad():
        logp = torch.log_softmax(model(toks).double(), -1)[:, 1:-1]
        nll = -logp.gather(-1, toks[:, 2:, None]).squeeze(-1).mean(-1).mean()
    assert float(back["clean_loss"]) == pytest.approx(float(nll), rel=1e-5)
    back = read_netcdf(tmp_path / "causal.nc")
    rerun = api.causal(model, EvalData.from_dataset(back))
    np.testing.assert_allclose(rerun["causal_score"].values, back["causal_score"].values, rtol=1e-6, atol=1e-7)


def test_tampered_eval_ids_are_detected(tmp_path):
    model = build_model(ModelConfig.debug("preln", n_layer=4), seed=3).eval()
    ds = api.angular(
        model, EvalData.from_tokens(torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(0)))
    )
    ds["eval_tokens"].values[0, 1] += 1
    with pytest.raises(DataError, match="do not hash"):
        EvalData.from_dataset(ds)

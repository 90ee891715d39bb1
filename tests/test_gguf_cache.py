"""The GGUF cache (depthlens.adapters.gguf_cache): a second open reads the cache; everything computed from the
model (weights, logits, tokenizer, a diagnostic's dataset) is bit-identical with and without it; the key is the
file's content; a damaged or stale entry is refused and rebuilt; the size limit evicts the least recently used;
`depthlens cache list|clear` and `--no-cache`."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from depthlens.adapters import gguf_cache
from depthlens.adapters.load import open_model
from gguf_tiny import tiny_llama, write_tiny_gguf


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_tiny_gguf(tiny_llama(seed=4, tie=True), tmp_path_factory.mktemp("g") / "tiny.Q8_0.gguf", quant="Q8_0")


def _same_model(a, b) -> None:
    sa, sb = a.model.hf.state_dict(), b.model.hf.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    toks = torch.randint(0, a.model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a.model(toks), b.model(toks))
    text = "the hat in the rain"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text) and a.tokenizer.name == b.tokenizer.name
    assert a.meta.config == b.meta.config
    drop = ("gguf_cache",)
    assert {k: v for k, v in a.provenance.items() if k not in drop} == {
        k: v for k, v in b.provenance.items() if k not in drop
    }


def test_second_open_hits_and_is_bit_identical(gguf_file):
    off = open_model(gguf_file, cache=False)
    first = open_model(gguf_file)
    second = open_model(gguf_file)
    assert (off.provenance["gguf_cache"], first.provenance["gguf_cache"], second.provenance["gguf_cache"]) == (
        "off",
        "stored",
        "hit",
    )
    assert off.provenance["gguf_sha256"] == gguf_cache._sha256(gguf_file)
    assert len(gguf_cache.entries()) == 1
    _same_model(off, second)
    _same_model(first, second)


def test_a_hit_never_dequantises(gguf_file, monkeypatch):
    open_model(gguf_file)
    import transformers

    def refuse(*a, **k):
        if k.get("gguf_file"):
            raise AssertionError("dequantised on a hit")
        return real(*a, **k)

    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    assert open_model(gguf_file).provenance["gguf_cache"] == "hit"


def test_diagnostic_dataset_is_identical_with_and_without_cache(gguf_file, monkeypatch):
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    data = EvalData.from_tokens(torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(1)))
    runs = {}
    for mode in ("1", "0", "0"):  # off, then stored, then a hit
        monkeypatch.setenv("DEPTHLENS_NO_CACHE", mode)
        ds = api.permutation(gguf_file, data, layers="all")
        runs[ds.attrs["gguf_cache"]] = ds
    assert list(runs) == ["off", "stored", "hit"]
    off, hit = runs["off"], runs["hit"]
    assert set(off.data_vars) == set(hit.data_vars) and len(off.data_vars) > 0
    for k in off.data_vars:
        assert off[k].equals(hit[k]), k
    when = ("gguf_cache", "created", "history")  # the clock: two runs a second apart differ there, nowhere else
    assert {k: v for k, v in off.attrs.items() if k not in when} == {
        k: v for k, v in hit.attrs.items() if k not in when
    }


def test_key_is_the_content_not_the_path(gguf_file, tmp_path):
    open_model(gguf_file)
    moved = tmp_path / "renamed.gguf"
    shutil.copy(gguf_file, moved)
    os.utime(moved, (1, 1))
    assert open_model(moved).provenance["gguf_cache"] == "hit"
    other = write_tiny_gguf(tiny_llama(seed=5, tie=True), tmp_path / "tiny.Q8_0.gguf", quant="Q8_0")
    assert open_model(other).provenance["gguf_cache"] == "stored"
    assert len(gguf_cache.entries()) == 2
    assert open_model(gguf_file, dtype=torch.float16).provenance["gguf_cache"] == "stored"  # dtype is in the key
    assert len(gguf_cache.entries()) == 3


@pytest.mark.parametrize("damage", ["flip a weight byte", "truncate weights", "entry.json", "stale builder"])
def test_damaged_entry_is_refused_and_rebuilt(gguf_file, damage, capsys):
    off = open_model(gguf_file, cache=False)
    open_model(gguf_file)
    (entry,) = [e["path"] for e in gguf_cache.entries()]
    w = os.path.join(entry, "model.safetensors")
    meta_file = Path(entry) / "entry.json"
    if damage == "flip a weight byte":
        b = bytearray(Path(w).read_bytes())
        b[-5] ^= 0x40
        Path(w).write_bytes(bytes(b))
    elif damage == "truncate weights":
        os.truncate(w, os.path.getsize(w) // 2)
    elif damage == "entry.json":
        meta_file.write_text("{")
    else:
        meta = json.loads(meta_file.read_text())
        meta["builder"]["transformers"] = "0.0.1"
        meta_file.write_text(json.dumps(meta))
    again = open_model(gguf_file)
    assert again.provenance["gguf_cache"] == "rebuilt"
    assert "GGUF cache entry" in capsys.readouterr().err
    _same_model(off, again)
    assert open_model(gguf_file).provenance["gguf_cache"] == "hit"  # the rebuilt entry is sound


def test_size_limit_evicts_least_recently_used(gguf_file, tmp_path, monkeypatch):
    a = gguf_file
    b = write_tiny_gguf(tiny_llama(seed=6, tie=True), tmp_path / "b.gguf", quant="Q8_0")
    c = write_tiny_gguf(tiny_llama(seed=7, tie=True), tmp_path / "c.gguf", quant="Q8_0")
    open_model(a)
    one = gguf_cache.entries()[0]["bytes"]
    monkeypatch.setenv("DEPTHLENS_GGUF_CACHE_MAX", str(int(2.5 * one)))
    open_model(b)
    time.sleep(0.05)
    assert open_model(a).provenance["gguf_cache"] == "hit"  # a is now more recently used than b
    open_model(c)  # three do not fit: b goes
    names = {e["gguf_name"] for e in gguf_cache.entries()}
    assert names == {a.name, "c.gguf"}
    monkeypatch.setenv("DEPTHLENS_GGUF_CACHE_MAX", str(one // 2))  # larger than the limit: not stored
    d = write_tiny_gguf(tiny_llama(seed=8, tie=True), tmp_path / "d.gguf", quant="Q8_0")
    assert open_model(d).provenance["gguf_cache"] == "not stored (over the size limit)"
    assert "d.gguf" not in {e["gguf_name"] for e in gguf_cache.entries()}


@pytest.mark.parametrize(("raw", "want"), [("", 20 * 2**30), ("0", 0), ("500M", 500 * 2**20), ("1.5G", 3 * 2**29)])
def test_max_bytes_parses(raw, want, monkeypatch):
    monkeypatch.setenv("DEPTHLENS_GGUF_CACHE_MAX", raw)
    assert gguf_cache.max_bytes() == want


def test_cli_cache_list_clear_and_no_cache(gguf_file, monkeypatch):
    from typer.testing import CliRunner

    from depthlens.cli import app

    monkeypatch.setenv("DEPTHLENS_NO_CACHE", "0")  # restored after the test: --no-cache sets it in this process
    r = CliRunner()
    out = r.invoke(app, ["--no-cache", "info", str(gguf_file), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["gguf_cache"] == "off" and gguf_cache.entries() == []
    assert os.environ["DEPTHLENS_NO_CACHE"] == "1"
    monkeypatch.setenv("DEPTHLENS_NO_CACHE", "0")
    assert json.loads(r.invoke(app, ["info", str(gguf_file), "--json"]).stdout)["gguf_cache"] == "stored"
    listed = json.loads(r.invoke(app, ["cache", "list", "--json"]).stdout)
    assert [e["gguf_name"] for e in listed["entries"]] == [gguf_file.name]
    assert listed["total_bytes"] == listed["entries"][0]["bytes"] > 0
    bad = r.invoke(app, ["cache", "clear", "nothing-like-this"])
    assert bad.exit_code == 1 and "no cache entry" in bad.stderr
    ok = r.invoke(app, ["cache", "clear", listed["entries"][0]["key"][:8]])
    assert ok.exit_code == 0 and "removed 1 cache entry" in ok.stdout
    assert gguf_cache.entries() == []


def test_info_second_run_reads_the_stored_facts_without_opening_the_model(gguf_file, tmp_path, monkeypatch):
    """`info` on a GGUF file: the first run opens it and stores what it printed beside the entry; a later run on
    the same bytes (any path) prints the same facts, with that path, without opening the model; a record left by
    other code is not trusted, and --no-cache prints the same facts from a full open."""
    from typer.testing import CliRunner

    from depthlens.adapters import load
    from depthlens.cli import app

    monkeypatch.setenv("DEPTHLENS_NO_CACHE", "0")
    r = CliRunner()

    def info(path, *flags):
        out = r.invoke(app, [*flags, "info", str(path), "--json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    off = info(gguf_file, "--no-cache")
    monkeypatch.setenv("DEPTHLENS_NO_CACHE", "0")
    first = info(gguf_file)
    key = f"{first['gguf_sha256']}-float32"
    assert (gguf_cache.cache_dir() / key / gguf_cache.INFO).is_file()
    real_open = load.open_model

    def no_open(*a, **k):
        raise AssertionError("the model was opened")

    monkeypatch.setattr(load, "open_model", no_open)
    second = info(gguf_file)
    copy = tmp_path / "renamed.gguf"
    shutil.copy(gguf_file, copy)
    renamed = info(copy)
    drop = ("gguf_cache",)
    assert {k: v for k, v in second.items() if k not in drop} == {k: v for k, v in off.items() if k not in drop}
    assert (off["gguf_cache"], first["gguf_cache"], second["gguf_cache"]) == ("off", "stored", "hit")
    assert renamed["model_path"] == str(copy.resolve()) and renamed["checkpoint"] == str(copy)
    assert {k: v for k, v in renamed.items() if k not in ("model_path", "checkpoint")} == {
        k: v for k, v in second.items() if k not in ("model_path", "checkpoint")
    }
    # a record from other code (here: its builder edited) is stale: the model is opened again
    rec_path = gguf_cache.cache_dir() / key / gguf_cache.INFO
    rec = json.loads(rec_path.read_text())
    rec["builder"]["code"] = "0" * 16
    rec_path.write_text(json.dumps(rec))
    assert gguf_cache.stored_info(Path(gguf_file)) is None
    monkeypatch.setattr(load, "open_model", real_open)
    again = info(gguf_file)
    assert again == {**second, "gguf_cache": "hit"} and json.loads(rec_path.read_text())["builder"] != rec["builder"]
    rec_path.write_text("{not json")  # damaged: ignored, and rewritten by the next full open
    assert gguf_cache.stored_info(Path(gguf_file)) is None

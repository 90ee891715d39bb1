"""Bad input, the rest (issue 35): JSON that parses but is no depthlens input (a duplicate key, NaN or Infinity, a
float that overflows, a 5,000-digit integer, nesting past the parser) is refused naming the file, override or
option; a FIFO given as a .gguf or as a weights file is named and never opened; `--device auto` names the option;
a FIFO or a device given to --data is bad data (exit 1), as `prepare` says of the same file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.errors import DepthlensError
from depthlens.io.files import StrictJSONError, read_json, strict_json
from helpers import FAST
from test_owned_outputs import ck, one_line, run_with_snapshots  # noqa: F401  (fixtures)
from test_trainer import corpus  # noqa: F401  (a fixture run_with_snapshots needs)

REPO = Path(__file__).resolve().parents[1]
BIG = "9" * 5000

NOT_INPUTS = {
    '{"a": 1, "a": 2}': "the key 'a' twice",
    '{"x": {"b": 1, "b": 1}}': "the key 'b' twice",
    '{"vocab_size": NaN}': "holds NaN",
    '{"lr": Infinity}': "holds Infinity",
    "[-Infinity]": "holds -Infinity",
    '{"lr": 1e999}': "overflows a float",
    f'{{"steps": {BIG}}}': "5,000-digit integer",
}


@pytest.mark.parametrize("text", list(NOT_INPUTS))
def test_strict_json_refuses_what_json_accepts(text, tmp_path):
    if BIG not in text:
        json.loads(text)  # the standard library takes it (a 5,000-digit integer stops at its own digit limit)
    with pytest.raises(StrictJSONError, match=NOT_INPUTS[text]):
        strict_json(text)
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(DepthlensError) as e:
        read_json(f, "a recipe", object_only=False)
    assert str(e.value).startswith(f"{f}: a recipe ") and NOT_INPUTS[text] in str(e.value)


def test_strict_json_keeps_what_is_fine():
    assert strict_json('{"a": [1, 2.5, -3e-2, "NaN"], "b": {"a": 1}, "n": 12345678901234567890}') == {
        "a": [1, 2.5, -0.03, "NaN"],
        "b": {"a": 1},
        "n": 12345678901234567890,
    }


def test_the_listed_messages_name_their_file_or_option(ck, tmp_path):  # noqa: F811
    runner = CliRunner()
    recipe = tmp_path / "dup.json"
    recipe.write_text('{"steps": 10, "steps": 20}')
    line = one_line(runner.invoke(app, ["train", str(recipe)]))
    assert str(recipe) in line and "'steps' twice" in line
    zoo = str(REPO / "depthlens" / "recipes" / "zoo_cpu.json")
    line = one_line(runner.invoke(app, ["train", zoo, "--run", "preln_l4", f"steps={BIG}"]), code=2)
    assert "override steps=" in line and "5,000-digit" in line
    line = one_line(runner.invoke(app, ["train", zoo, "--run", "preln_l4", "meta=" + "[" * 100_000]), code=2)
    assert "override meta=" in line and "nested too deeply" in line
    line = one_line(runner.invoke(app, ["causal", str(ck), "--device-map", "[" * 100_000, *FAST]), code=2)
    assert "--device-map" in line and "100,000 characters" in line and len(line) < 300  # one readable line
    line = one_line(runner.invoke(app, ["causal", str(ck), "--device", "auto", *FAST]), code=2)
    assert "--device" in line and "'auto'" in line and "--device-map auto" in line

    nan_tok = tmp_path / "nan_tok"
    shutil.copytree(ck, nan_tok)
    (nan_tok / "tokenizer_config.json").write_text('{"vocab_size": NaN, "kind": "bytes"}')
    line = one_line(runner.invoke(app, ["info", str(nan_tok)]))
    assert "tokenizer_config.json" in line and "NaN" in line

    fifo_gguf = tmp_path / "model.gguf"
    os.mkfifo(fifo_gguf)
    line = one_line(runner.invoke(app, ["info", str(fifo_gguf)]))
    assert str(fifo_gguf) in line and "FIFO" in line
    fifo_weights = tmp_path / "fifo_weights"
    shutil.copytree(ck, fifo_weights)
    (fifo_weights / "model.safetensors").unlink()
    os.mkfifo(fifo_weights / "model.safetensors")
    line = one_line(runner.invoke(app, ["info", str(fifo_weights)]))
    assert str(fifo_weights / "model.safetensors") in line and "FIFO" in line

    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)
    by_prepare = one_line(runner.invoke(app, ["prepare", str(fifo), "--out", str(tmp_path / "ds")]))
    by_data = one_line(runner.invoke(app, ["causal", str(ck), "--data", str(fifo), *FAST]))  # the same exit: 1
    assert "FIFO" in by_prepare and "--data" in by_data and "FIFO" in by_data


# --- token ids past the vocabulary --------------------------------------------------------------------------


def _shards(d: Path, dtype: str, bad: int, at: int) -> Path:
    import numpy as np

    from depthlens.data.shards import write_shard

    d.mkdir()
    ids = (np.arange(6000) % 250).astype(dtype)
    ids[at] = bad
    for split in ("train", "val"):
        write_shard(d / f"{split}_000.bin", ids, np.dtype(dtype))
    return d


@pytest.mark.parametrize(("dtype", "bad"), [("<u2", 300), ("<u2", 65535), ("<u4", 2**32 - 1)])
def test_training_refuses_ids_past_the_vocabulary_before_any_step(tmp_path, dtype, bad):
    data = _shards(tmp_path / "sh", dtype, bad, at=4321)
    recipe = tmp_path / "r.json"
    model = {"arch": "preln", "d_model": 32, "n_layer": 2, "n_head": 2, "vocab_size": 257, "max_seq_len": 32}
    cfg = {"model": model, "data": str(data), "seq_len": 16, "global_batch": 4, "steps": 3, "warmup": 1}
    recipe.write_text(json.dumps({**cfg, "out": str(tmp_path / "run"), "export": str(tmp_path / "ck")}))
    line = one_line(CliRunner().invoke(app, ["train", str(recipe)]))
    assert f"token id {bad}" in line and "vocabulary of 257" in line and str(data) in line, line
    assert not (tmp_path / "ck").exists() and not (tmp_path / "run" / "log.jsonl").exists()


def test_a_large_dataset_is_checked_window_by_window(tmp_path, monkeypatch):
    from depthlens.data.shards import TokenDataset
    from depthlens.errors import DataError

    data = _shards(tmp_path / "sh", "<u4", 2**32 - 1, at=100)
    monkeypatch.setattr(TokenDataset, "SCAN_TOKENS", 10)  # too large to read whole: checked as read
    ds = TokenDataset.from_dir(data, "train")
    ds.require_vocab(257)
    assert ds.batch([0], 16).max() < 257  # tokens 0..16: fine
    with pytest.raises(DataError, match=f"token id {2**32 - 1} is outside the model's vocabulary of 257"):
        ds.batch([6], 16)  # tokens 96..112 hold it


def test_analysis_refuses_ids_past_the_vocabulary(ck, tmp_path):  # noqa: F811
    for dtype, bad in (("<u2", 300), ("<u4", 2**32 - 1)):
        data = _shards(tmp_path / f"sh{dtype[-1]}", dtype, bad, at=7)
        line = one_line(CliRunner().invoke(app, ["causal", str(ck), "--data", str(data), *FAST, "--n-seq", "200"]))
        assert f"token id {bad}" in line and "vocab_size 257" in line and str(data) in line


# --- --json is strict JSON ------------------------------------------------------------------------------------


def test_json_output_is_strict_json_track_check_included(ck, run_with_snapshots):  # noqa: F811
    runner = CliRunner()
    r = runner.invoke(app, ["track", str(run_with_snapshots), "--check", "--json"])
    assert r.exit_code == 0, r.output
    got = strict_json(r.stdout)
    assert got == {
        "runs": [
            {"name": "preln_l4", "steps": [0, 2, 4], "requested_by": got["runs"][0]["requested_by"], "pending": []}
        ]
    }
    plain = runner.invoke(app, ["track", str(run_with_snapshots), "--check"])
    assert plain.exit_code == 0 and "3 snapshots" in plain.stdout  # without --json: the lines for a person
    for args in (["info", str(ck), "--json"], ["hooks", str(ck), "--json"], ["causal", str(ck), *FAST, "--json"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
        assert isinstance(strict_json(r.stdout), dict), args  # no NaN / Infinity, one object

"""Progress feedback: train, eval and info show rich progress on stderr when it is a terminal, and nothing
with --json or when stderr is not a terminal (pipes, logs, CliRunner)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import depthlens
import depthlens.cli.feedback as feedback
from depthlens.cli import app
from depthlens.data.shards import write_shard
from depthlens.models import ModelConfig, build_model


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    root = tmp_path_factory.mktemp("fb")
    (root / "notes.txt").write_text("Some text to evaluate on. " * 100)
    return depthlens.save(build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=0), root / "ck")


def _recipe(tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    doc = np.array([256] + list(b"hello depthlens, " * 40))
    write_shard(data / "train_000.bin", np.concatenate([doc] * 20))
    write_shard(data / "val_000.bin", np.concatenate([doc] * 4))
    r = tmp_path / "r.json"
    r.write_text(json.dumps(dict(model=dict(arch="preln", d_model=32, n_layer=2, n_head=2, vocab_size=257, max_seq_len=32),
                                 data=str(data), seq_len=32, global_batch=4, steps=3, warmup=1, out=str(tmp_path / "run"),
                                 final_eval_batches=1)))
    return r


@pytest.mark.parametrize("tty", [True, False])
def test_progress_only_on_a_terminal_and_never_with_json(ck, tmp_path, monkeypatch, tty):
    monkeypatch.setattr(feedback, "stderr_is_tty", lambda: tty)
    notes = ck.parent / "notes.txt"
    cases = {"info": (["info", str(ck)], "loading"),
             "eval": (["eval", str(ck), "--data", str(notes), "--n-seq", "4", "--seq-len", "16", "--no-humaneval"], "eval"),
             "train": (["train", str(_recipe(tmp_path))], "train")}
    for name, (args, word) in cases.items():
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, (name, r.stderr)
        assert (word in r.stderr) == tty, (name, r.stderr)
        if name != "train":
            r = CliRunner().invoke(app, [*args, "--json"])
            assert r.exit_code == 0 and r.stderr == "", (name, r.stderr)
            json.loads(r.stdout)

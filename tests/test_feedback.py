"""Progress feedback: train, eval and info show a rich bar on stderr when it is a terminal, plain lines when it is
not (pipes, logs), nothing with --quiet; --json keeps stdout one JSON document either way."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import depthlens
import depthlens.cli.feedback as feedback
from depthlens.cli import app
from depthlens.data.shards import write_shard
from depthlens.models import ModelConfig, build_model
from helpers import FAST_INTERVALS


@pytest.fixture(autouse=True)
def progress_on(monkeypatch):
    monkeypatch.delenv("DEPTHLENS_PROGRESS", raising=False)  # conftest turns it off for every other test


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
    r.write_text(
        json.dumps(
            dict(
                model=dict(arch="preln", d_model=32, n_layer=2, n_head=2, vocab_size=257, max_seq_len=32),
                data=str(data),
                seq_len=32,
                global_batch=4,
                steps=3,
                warmup=1,
                out=str(tmp_path / "run"),
                final_eval_batches=1,
            )
        )
    )
    return r


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_on_a_terminal_lines_otherwise_quiet_silences(ck, tmp_path, monkeypatch, tty):
    monkeypatch.setattr(feedback, "stderr_is_tty", lambda: tty)
    monkeypatch.setattr(feedback, "PLAIN_AFTER_S", 0.0)  # the tiny model loads and trains in well under 2 s
    notes = ck.parent / "notes.txt"
    cases = {
        "info": (["info", str(ck)], "loading", f"loading {ck.name}: "),
        "eval": (
            ["eval", str(ck), "--data", str(notes), *FAST_INTERVALS, "--no-humaneval"],
            "eval",
            "[1/1] eval ",
        ),
        "train": (["train", str(_recipe(tmp_path))], "train", "[3/3] train "),
    }
    for name, (args, word, line) in cases.items():
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, (name, r.stderr)
        assert word in r.stderr, (name, r.stderr)
        if not tty:  # a log gets plain lines: the count and the step's seconds
            assert any(x.startswith(line) and re.search(r" [\d.]+ s( · |$)", x) for x in r.stderr.splitlines()), (
                name,
                r.stderr,
            )
        if name != "train":
            r = CliRunner().invoke(app, [*args, "--json"])
            assert r.exit_code == 0, (name, r.stderr)
            json.loads(r.stdout)  # stdout is the JSON document only; progress stays on stderr
        r = CliRunner().invoke(app, [*args, "--quiet"] if name != "train" else [*args[:1], "--quiet", *args[1:]])
        assert r.exit_code == 0 and r.stderr == "", (name, r.stderr)

"""Progress everywhere: the engines' `progress(done, total)` callback observes without changing a number, its
counts are the engines' own units; the CLI's one idiom prints a bar on a terminal, a plain line per step
otherwise, nothing with --quiet, and keeps --json clean on stdout."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

from depthlens.cli import app, feedback
from depthlens.models import ModelConfig, build_model
from depthlens.runtime.evaldata import EvalData
from helpers import FAST_INTERVALS

torch.set_num_threads(1)
L, N, T = 4, 4, 16


@pytest.fixture(autouse=True)
def progress_on(monkeypatch):
    monkeypatch.delenv("DEPTHLENS_PROGRESS", raising=False)  # conftest turns it off for every other test


def _model(slug: str):
    return build_model(ModelConfig.debug(slug, n_layer=L, vocab_size=257, max_seq_len=32), seed=0)


def _data() -> EvalData:
    return EvalData.from_tokens(np.random.default_rng(0).integers(0, 256, size=(N, T)))


def _same(a: xr.Dataset, b: xr.Dataset) -> None:
    for ds in (a, b):
        for k in ("created", "history"):
            ds.attrs.pop(k, None)
    xr.testing.assert_identical(a, b)  # every value, coordinate and attribute: 0 tolerance


# engine, design, options, expected total: units counted independently of the engine (2 batches of 2 sequences)
CASES = [
    ("depthlens.diagnostics.causal.engine:causal_scores", "preln", {"variants": ("current",), "seq_batch": 2}, 2 * L),
    (
        "depthlens.diagnostics.causal.engine:causal_scores",
        "hc",
        {"variants": ("current", "future"), "layers": "late", "seq_batch": 2},
        None,
    ),
    (
        "depthlens.diagnostics.permutation.engine:permutation_scores",
        "preln",
        {"pairs": "all", "seq_batch": 2},
        2 * L * (L - 1) // 2,
    ),
    ("depthlens.diagnostics.angular.engine:angular_distances", "preln", {"batch_size": 2}, 2),
    ("depthlens.diagnostics.mixing.engine:depth_mixing_dataset", "hc", {"batch_size": 2}, 2),
    ("depthlens.diagnostics.rank.engine:effective_rank_dataset", "hc", {"batch_size": 2}, 2),
    ("depthlens.diagnostics.attnres.engine:attnres_dataset", "full_attnres", {"batch_size": 2}, 2),
]


@pytest.mark.parametrize("engine,slug,opts,total", CASES, ids=[f"{c[0].split(':')[1]}-{c[1]}" for c in CASES])
def test_engine_progress_counts_and_changes_nothing(engine, slug, opts, total):
    from depthlens.diagnostics.registry import resolve

    fn, model, data = resolve(engine), _model(slug), _data()
    calls: list[tuple[int, int]] = []
    with torch.no_grad():
        plain = fn(model, data, **opts)
        watched = fn(model, data, **opts, progress=lambda d, t: calls.append((d, t)))
    _same(plain, watched)
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] > 0, calls
    assert len({t for _, t in calls}) == 1, calls  # the total is known up front and never changes
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(done) >= 3  # at least one step per batch after the opening (0, total)
    if total is None:  # causal with the future variant: one skip run per (late layer, cut slot) per batch
        n_late = L - L // 4
        K = min(4, len(range(8, T - 4, 8)))  # Csordás' cut grid, at most n_cuts = 4 per sequence
        total = 2 * (n_late + n_late * K)  # current: one per late layer; future: one per (layer, cut)
    assert calls[-1][1] == total


@pytest.fixture(scope="module")
def ck(tiny_ckpt):
    return tiny_ckpt("preln", n_layer=L)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    p = tmp_path_factory.mktemp("txt") / "eval.txt"
    p.write_text("Some text to evaluate the diagnostics on, with a few words. " * 60)
    return p


def _plain_lines(monkeypatch):
    monkeypatch.setattr(feedback, "stderr_is_tty", lambda: False)
    monkeypatch.setattr(feedback, "PLAIN_AFTER_S", 0.0)  # tiny models finish in well under the 2 s of real runs


@pytest.mark.parametrize("cmd,word", [("causal", "causal"), ("permute", "permute"), ("angular", "angular")])
def test_cli_plain_lines_quiet_and_clean_json(ck, text, tmp_path, monkeypatch, cmd, word):
    _plain_lines(monkeypatch)
    base = [cmd, str(ck), "--data", str(text), *FAST_INTERVALS, "--batch-size", "2"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a.nc"), "--json"])
    assert r.exit_code == 0, r.stderr
    json.loads(r.stdout)  # stdout is the JSON document only
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"loading {ck.name}: ") and lines[0].endswith(" s"), r.stderr
    steps = [
        m for m in (re.match(rf"\[(\d+)/(\d+)\] {word} \S+ \(?.*?\)? ?[\d.]+ s(, eta \S+)?$", x) for x in lines[1:])
    ]
    assert steps and all(steps), r.stderr
    assert steps[-1].group(1) == steps[-1].group(2), r.stderr  # the last line completes the count
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b.nc"), "--quiet"])
    assert r.exit_code == 0 and r.stderr == "", r.stderr


def test_plain_lines_wait_for_long_work(monkeypatch, capsys):
    monkeypatch.setattr(feedback, "stderr_is_tty", lambda: False)
    monkeypatch.setattr(feedback, "PLAIN_AFTER_S", 3600.0)
    with feedback.Progress("quick", 3) as p:
        for k in range(3):
            p.step(f"step {k}")
    assert capsys.readouterr().err == ""  # a short command stays silent in a log
    monkeypatch.setattr(feedback, "PLAIN_AFTER_S", 0.0)
    with feedback.Progress("long", 2) as p:
        p.step("a")
        p.step("b")
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"\[1/2\] long: a [\d.]+ s, eta \d+s", err[0]) and re.fullmatch(
        r"\[2/2\] long: b [\d.]+ s", err[1]
    )


def test_bar_on_a_terminal_nests_and_leaves_no_trace(monkeypatch, capsys):
    monkeypatch.setattr(feedback, "stderr_is_tty", lambda: True)
    with feedback.Progress("outer", 2) as outer:
        with feedback.spinner("loading x") as inner:  # nested: a second row of the same display, no LiveError
            inner.update(1, 2)
            inner.update(2, 2)
        outer.step("one")
        outer.step("two")
    assert feedback._LIVE == []
    monkeypatch.setattr(feedback, "QUIET", True)
    with feedback.Progress("silent", 1) as p:
        p.step()
    assert p.mode is None


def test_report_progress_lines_and_timings_untracked(tmp_path, text, tiny_ckpt, monkeypatch):
    """`depthlens report` in a log: a line per step; the timings go to timings.json, not the tracked files."""
    _plain_lines(monkeypatch)
    ck = tiny_ckpt("hc", n_layer=L)
    out = tmp_path / "rep"
    r = CliRunner().invoke(
        app,
        [
            "report",
            str(ck),
            "--out",
            str(out),
            "--data",
            str(text),
            "--n-seq",
            "2",
            "--seq-len",
            "16",
            "--n-boot",
            "5",
            "--metrics",
            "causal,angular",
        ],
    )
    assert r.exit_code == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("[")]
    assert lines[-1].startswith("[") and "report: write" in lines[-1], r.stderr
    assert any(re.match(r"\[\d+/\d+\] report: hc_l4: causal [\d.]+ s", x) for x in lines), r.stderr
    t = json.loads((out / "timings.json").read_text())
    assert set(t["checkpoints"]["hc_l4"]) == {"causal", "angular"} and "compute" in t["seconds"]
    assert "seconds" not in json.loads((out / "summary.json").read_text())[0]
    m = json.loads((out / "manifest.json").read_text())
    assert "created" not in m and "seconds" not in m
    assert not re.search(r"\d+(\.\d)? s\b", (out / "README.md").read_text().split("## Files")[1])

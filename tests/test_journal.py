"""A stopped pruning stage resumes from its journal and ends bit-identical to an unbroken run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import xarray as xr

from depthlens.diagnostics import pruning
from depthlens.diagnostics.pruning_heldout import heldout_curves, random_baselines
from depthlens.models import ModelConfig, build_model
from depthlens.runtime.evaldata import EvalData
from depthlens.runtime.journal import Journal
from helpers import count_calls, load_script

L = 5
DOMAINS = ["english"] * 3 + ["code"] * 3


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def setup():
    model = build_model(ModelConfig.debug("preln", n_layer=L), seed=4).eval()
    tokens = torch.randint(0, model.config.vocab_size, (6, 16), generator=torch.Generator().manual_seed(1))
    return model, EvalData.from_tokens(tokens)


@pytest.fixture
def nll_calls(monkeypatch):
    """How many cuts were run through the model (the journal's replays are not)."""
    return count_calls(monkeypatch, pruning, "_sequence_nll")


def _same(a: xr.Dataset, b: xr.Dataset) -> None:
    """Identical values, coords and attrs (the cost record and provenance too), but for when and by what."""
    a, b = a.copy(), b.copy()
    for ds in (a, b):
        for key in ("created", "history"):  # when it was made, by which command line
            ds.attrs.pop(key, None)
    xr.testing.assert_identical(a, b)


def _stop_after(n):
    def progress(done, total):
        if done > n:
            raise Stop

    return progress


def test_journal_reads_back_every_float_exactly_and_skips_a_cut_line(tmp_path):
    path = tmp_path / "j.jsonl"
    values = np.array([0.1 + 0.2, 5e-324, -0.0, 1 / 3, 1e308, 2.5])
    j = Journal(path, {"a": (1, 2)})
    j.put([3, 1], values)
    j.put([4], values / 2)
    with path.open("a") as f:
        f.write('{"key": "2", "values": [1.0, 2')  # a kill in the middle of a line
    again = Journal(path, {"a": [1, 2]})
    got = again.get([3, 1])
    assert got is not None and got.tobytes() == values.tobytes()  # bit-exact, signed zero included
    assert again.get([2]) is None and again.replayed == 1
    again.put([2], values)  # after the cut line, on a line of its own
    third = Journal(path, {"a": [1, 2]})
    assert third.get([2]) is not None and third.get([4]) is not None


def test_a_journal_of_another_run_is_set_aside_not_mixed_in(tmp_path):
    path = tmp_path / "j.jsonl"
    Journal(path, {"eval": "x"}).put([1], np.ones(3))
    other = Journal(path, {"eval": "y"})
    assert other.get([1]) is None
    assert (tmp_path / "j.jsonl.stale").exists()
    assert json.loads(path.read_text().splitlines()[0]) == {"identity": {"eval": "y"}}


def test_random_baselines_resume_bit_identical(setup, tmp_path, nll_calls):
    model, data = setup
    whole = random_baselines(model, data, k_max=2, n_random=3, seed=2)
    total = nll_calls[0]
    with pytest.raises(Stop):
        random_baselines(model, data, k_max=2, n_random=3, seed=2, journal=tmp_path, progress=_stop_after(5))
    # 2 baselines x 2 k x 3 draws = 12 cuts; the stopped run stored the first 6 (fewer where a draw repeats a cut)
    stored = {json.loads(line)["key"] for line in (tmp_path / "all.jsonl").read_text().splitlines()[1:]}
    assert 1 <= len(stored) <= 6
    cuts = {
        ",".join(map(str, np.flatnonzero(row)))
        for row in whole["removed"].values.reshape(-1, L)
        if row.any()  # k = 0 rows are all zero
    }
    assert stored < cuts and total == 1 + 12  # one clean pass and one pass per draw (one batch)
    nll_calls[0] = 0
    resumed = random_baselines(model, data, k_max=2, n_random=3, seed=2, journal=tmp_path)
    _same(resumed, whole)
    # the clean pass once (it ties the journal to this model), then each cut not yet stored, once
    assert nll_calls[0] == 1 + len(cuts - stored)


def test_heldout_curves_resume_bit_identical(setup, tmp_path, nll_calls):
    model, data = setup
    kw = dict(domains=DOMAINS, k_max=2, criteria=("skip_loss", "greedy", "block_influence"))
    whole = heldout_curves(model, data, **kw)
    total = nll_calls[0]
    with pytest.raises(Stop):
        heldout_curves(model, data, **kw, journal=tmp_path, progress=_stop_after(7))
    nll_calls[0] = 0
    resumed = heldout_curves(model, data, **kw, journal=tmp_path)
    _same(resumed, whole)
    assert 0 < nll_calls[0] < total


def test_a_changed_model_starts_afresh(setup, tmp_path):
    model, data = setup
    random_baselines(model, data, k_max=1, n_random=2, seed=0, journal=tmp_path)
    other = build_model(ModelConfig.debug("preln", n_layer=L), seed=5).eval()
    fresh = random_baselines(other, data, k_max=1, n_random=2, seed=0, journal=tmp_path)
    _same(fresh, random_baselines(other, data, k_max=1, n_random=2, seed=0))
    assert (tmp_path / "all.jsonl.stale").exists()


def test_the_report_script_resumes_a_stopped_pruning_stage(tmp_path, monkeypatch):
    """scripts/real_model_report.py: a run stopped mid-stage leaves its cuts in data/journal/; the rerun with
    --resume finishes from them, writes the same dataset a fresh run writes, and removes the journal."""
    import depthlens

    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0), ckpt)
    mod = load_script("real_model_report")
    args = [str(ckpt), "--n-seq", "2", "--seq-len", "24", "--threads", "1", "--calibration", "none", "--no-render"]
    stages = ["--stages", "pruning_random", "--k-max", "1"]
    real, calls = pruning._sequence_nll, [0]

    def dies(*a, **k):
        calls[0] += 1
        if calls[0] == 3:  # the clean pass and two cuts done
            raise KeyboardInterrupt
        return real(*a, **k)

    out = tmp_path / "out"
    monkeypatch.setattr(pruning, "_sequence_nll", dies)
    with pytest.raises(KeyboardInterrupt):
        mod.main([*args, "--out", str(out), *stages])
    journal = out / "data" / "journal" / "pruning_random" / "all.jsonl"
    assert len(journal.read_text().splitlines()) > 1 and not (out / "data" / "pruning_random.nc").exists()
    monkeypatch.setattr(pruning, "_sequence_nll", real)
    mod.main([*args, "--out", str(out), *stages, "--resume"])
    assert not (out / "data" / "journal" / "pruning_random").exists()
    mod.main([*args, "--out", str(tmp_path / "fresh"), *stages])
    resumed, fresh = (xr.load_dataset(d / "data" / "pruning_random.nc") for d in (out, tmp_path / "fresh"))
    np.testing.assert_array_equal(resumed["seq_loss"].values, fresh["seq_loss"].values)
    np.testing.assert_array_equal(resumed["removed"].values, fresh["removed"].values)

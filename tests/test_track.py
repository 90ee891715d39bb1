"""`depthlens track`: snapshot series → one (run, step) dataset; last step == a direct analysis of the final
checkpoint; resume skips done work; bad series refused with one line and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from depthlens.data.shards import write_shard
from depthlens.data.tokenizers import ByteTokenizer
from depthlens.models import ModelConfig, build_model
from depthlens.studies import track as T
from depthlens.training.config import RunConfig
from helpers import FAST_BOOT, FAST_N_BOOT

TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune.\ndef add(a, b):\n    return a + b\n\n"
)
SNAP_STEPS = [2, 4, 8]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    tok = ByteTokenizer()
    doc = [tok.bos_id] + tok.encode(TEXT * 4)
    write_shard(d / "train_000.bin", np.array(doc * 30))
    write_shard(d / "val_000.bin", np.array(doc * 4))
    (d / "eval.txt").write_text(TEXT * 6)
    return d


def train_run(corpus: Path, out: Path, arch: str = "preln", steps: int = 8, **snap) -> RunConfig:
    """Train a tiny model `steps` steps with the trainer's analysis snapshots (default: at SNAP_STEPS)."""
    from depthlens.training.trainer import train

    cfg = RunConfig.from_dict(
        dict(
            model=dict(arch=arch, d_model=32, n_layer=4, n_head=2, vocab_size=257, max_seq_len=32),
            data=str(corpus),
            seq_len=32,
            global_batch=4,
            steps=steps,
            lr=3e-3,
            warmup=2,
            out=str(out),
            final_eval_batches=1,
            snapshot_eval_batches=1,
            name=out.name,
            threads=1,
            **(snap or {"snapshots": SNAP_STEPS}),
        )
    )
    train(cfg)
    return cfg


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {arch: root / f"{arch}_l4" for arch in ("preln", "hc", "block_attnres")}
    train_run(corpus, out["preln"], "preln")
    train_run(corpus, out["hc"], "hc")
    train_run(corpus, out["block_attnres"], "block_attnres", snapshots=[0, 4, 8])  # other steps: outer join
    return out


def invoke(args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(r, code=1):
    assert r.exit_code == code, (r.exit_code, r.output)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:"), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- the trainer's snapshots: the format `track` reads, at the requested steps only ---------------------


def test_requested_steps():
    assert T.requested_steps({"steps": 100, "snapshot_every_log2": True}) == [0, 16, 32, 64, 100]
    assert T.requested_steps({"steps": 64, "snapshot_every_log2": True}) == [0, 16, 32, 64]
    assert T.requested_steps({"steps": 10, "snapshot_every_log2": True}) == [0, 10]
    assert T.requested_steps({"steps": 100, "snapshots": [64, 16, 32]}) == [16, 32, 64]
    assert T.requested_steps({"steps": 100}) is None


@pytest.mark.slow
def test_trainer_snapshots_at_requested_steps_only(corpus, tmp_path):
    cfg = train_run(corpus, tmp_path / "log2", steps=20, snapshot_every_log2=True)
    snaps = sorted((tmp_path / "log2" / "snapshots").iterdir())
    assert [p.name for p in snaps] == ["step_0000000", "step_0000016", "step_0000020"]  # 0, 2^4, the last step
    assert [p.name for p in snaps] == [f"step_{s:07d}" for s in T.requested_steps(cfg.to_dict())]
    for p in snaps:
        rec = json.loads((p / "snapshot.json").read_text())
        step = int(p.name.split("_")[1])
        assert rec["step"] == step and rec["tokens"] == step * 4 * 32 and rec["run"] == "log2"
        assert np.isfinite(rec["val_loss"]) and depthlens.load(p).config.arch == "preln"
    series = T.scan([tmp_path / "log2"])[0]  # the recipe is found in the run's checkpoint/train.json
    assert series.requested == [0, 16, 20] and series.requested_from.endswith("train.json")
    assert [s.step for s in series.snapshots] == [0, 16, 20] and series.pending == []


# --- happy path: the last step is the final checkpoint's analysis -----------------------------------------


@pytest.mark.slow
def test_last_step_equals_direct_analysis(runs, corpus, tmp_path):
    from depthlens.diagnostics.sweep import headline
    from depthlens.studies import api

    out = tmp_path / "track"
    r = invoke(
        [
            "track",
            runs["preln"],
            "--metric",
            "causal,permutation,angular",
            "--out",
            out,
            "--data",
            corpus / "eval.txt",
            *FAST_BOOT,
            "--json",
        ]
    )
    assert r.exit_code == 0, r.output
    ds = xr.load_dataset(out / "track.nc")
    assert list(ds["step"].values) == SNAP_STEPS and ds["run"].values.tolist() == ["preln_l4"]
    assert ds["tokens"].sel(run="preln_l4").values.tolist() == [s * 4 * 32 for s in SNAP_STEPS]
    assert ds.attrs["Conventions"] == "CF-1.11" and ds["causal_share"].attrs["units"] == "1"
    assert (out / "track.png").stat().st_size > 10_000 and "Depth over training" in (out / "README.md").read_text()
    summary = json.loads(r.stdout)
    assert summary[0]["step"] == SNAP_STEPS and summary[0]["design"] == "preln"

    final = runs["preln"] / "checkpoint"  # the trainer's export after the last step
    last = runs["preln"] / "snapshots" / f"step_{SNAP_STEPS[-1]:07d}"
    a, b = depthlens.load(final).model.state_dict(), depthlens.load(last).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    model, ck = api.load_model(final)
    ev = api.eval_data_for(model, corpus / "eval.txt", ck, n_seq=4, seq_len=16, seed=0)
    assert ev.sha256 == ds.attrs["eval_data_sha256"]
    direct = api.causal(final, ev, layers="all")
    h = headline(direct, "causal", 0.45, n_boot=FAST_N_BOOT, seed=0)
    got = ds.sel(run="preln_l4", step=SNAP_STEPS[-1])
    assert float(got["causal_share"]) == h["share"]
    assert float(got["causal_ci_low"]) == h["ci_low"] and float(got["causal_ci_high"]) == h["ci_high"]
    np.testing.assert_array_equal(
        got["causal_score"].values, direct["causal_score"].sel(aggregator="max", variant="current").values
    )
    perm = api.permutation(final, ev, layers="late")
    np.testing.assert_array_equal(got["perm_abs"].values, perm["perm_abs"].values)
    assert float(got["perm_share"]) == headline(perm, "perm_abs", 0.15, n_boot=FAST_N_BOOT, seed=0)["share"]
    ang = api.angular(final, ev, positions="all")
    np.testing.assert_array_equal(got["angular_profile"].values, ang["profile"].values)
    # the first snapshot is a different model: the series is not one result repeated
    assert not np.array_equal(ds["causal_score"].sel(run="preln_l4", step=2).values, got["causal_score"].values)


@pytest.mark.slow
def test_runs_share_eval_tokens_and_join_on_step(runs, corpus, tmp_path, result_cache):
    from depthlens.studies import api

    out = tmp_path / "all"
    r = invoke(
        [
            "track",
            runs["preln"],
            runs["hc"],
            runs["block_attnres"],
            "--metric",
            "causal,erank,attnres",
            "--out",
            out,
            "--data",
            corpus / "eval.txt",
            *FAST_BOOT,
        ]
    )
    assert r.exit_code == 0, r.output
    ds = xr.load_dataset(out / "track.nc")
    assert ds["design"].values.tolist() == ["preln", "hc", "block_attnres"]
    assert list(ds["step"].values) == [0, 2, 4, 8]  # the union; a run lacks the others
    assert ds["snapshot"].sel(run="preln_l4", step=0).item() == "" and np.isnan(ds["tokens"].sel(run="hc_l4", step=0))
    assert (
        np.isnan(ds["causal_share"].sel(run="block_attnres_l4", step=2))
        and ds["tokens"].sel(run="block_attnres_l4", step=0) == 0
    )
    assert np.isnan(ds["erank"].sel(run="preln_l4")).all() and np.isfinite(ds["erank"].sel(run="hc_l4", step=8)).all()
    parts = sorted(p.name for p in result_cache.rglob("*.nc"))  # one result cache entry per snapshot and metric
    assert len(parts) == 3 * 1 + 3 * 2 + 3 * 2  # preln: causal; hc: causal + erank; block_attnres: causal + attnres
    evs = {xr.load_dataset(p).attrs["eval_data_sha256"] for p in result_cache.rglob("*.nc")}
    assert evs == {ds.attrs["eval_data_sha256"]}
    # the last step of the rank and AttnRes rows are the engines' own numbers on the final checkpoints
    model, ck = api.load_model(runs["hc"] / "checkpoint")
    ev = api.eval_data_for(model, corpus / "eval.txt", ck, n_seq=4, seq_len=16, seed=0)
    er = api.effective_rank(runs["hc"] / "checkpoint", ev)
    np.testing.assert_array_equal(ds["erank"].sel(run="hc_l4", step=8).values, er["erank"].sel(statistic="mean").values)
    ar = api.attnres(runs["block_attnres"] / "checkpoint", ev)
    got = ds.sel(run="block_attnres_l4", step=8)
    np.testing.assert_array_equal(got["self_weight"].values, ar["self_weight"].values)
    assert float(got["dead_prefix"]) == float(ar["dead_prefix"].sel(eps=0.05))


# --- resume ---------------------------------------------------------------------------------------------


def _cache_entry(cache: Path, snapshot: str, metric: str) -> Path:
    """The result cache's entry of `metric` on the snapshot directory named `snapshot`."""
    (entry,) = [
        p
        for p in cache.rglob("*.nc")
        if (a := xr.load_dataset(p).attrs)["metric"] == metric and Path(a["checkpoint_path"]).name == snapshot
    ]
    return entry


@pytest.mark.slow
def test_rerun_skips_done_work(runs, corpus, tmp_path, monkeypatch, result_cache):
    out = tmp_path / "t"
    args = ["track", runs["preln"], "--metric", "causal", "--out", out, "--data", corpus / "eval.txt", *FAST_BOOT]
    assert invoke(args).exit_code == 0
    first, first_bytes = xr.load_dataset(out / "track.nc"), (out / "track.nc").read_bytes()
    calls = []
    real = T.registry.run

    def counting(name, *a, **k):
        calls.append(name)
        return real(name, *a, **k)

    monkeypatch.setattr(T.registry, "run", counting)
    r = invoke(args)
    assert r.exit_code == 0, r.output
    assert calls == []  # everything came from the result cache
    assert "results: 0 computed, 3 from the cache" in r.stdout  # 3 snapshots
    assert (out / "track.nc").read_bytes() == first_bytes  # a rerun writes the same file
    xr.testing.assert_identical(first.drop_attrs(), xr.load_dataset(out / "track.nc").drop_attrs())
    _cache_entry(result_cache, "step_0000004", "causal").unlink()
    r = invoke(args)
    assert r.exit_code == 0 and "results: 1 computed, 2 from the cache" in r.stdout
    assert calls == ["causal"]  # only the missing snapshot
    r = invoke(
        [*args[: -len(FAST_BOOT)], "--n-seq", "5", "--seq-len", "16", "--n-boot", str(FAST_N_BOOT)]
    )  # new eval tokens: all again
    assert r.exit_code == 0 and calls == ["causal"] * 4


# --- a list of checkpoints given in order ------------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_list_in_order(runs, corpus, tmp_path):
    src = runs["preln"] / "snapshots"
    ckpts = []
    for s in SNAP_STEPS:  # HF-style local revisions: no snapshot.json, the step is in the name
        d = tmp_path / "revs" / f"rev-step{s}"
        shutil.copytree(src / f"step_{s:07d}", d)
        (d / "snapshot.json").unlink()
        ckpts.append(d)
    out = tmp_path / "list"
    r = invoke(
        [
            "track",
            *ckpts,
            "--metric",
            "causal",
            "--out",
            out,
            "--tokens-per-step",
            "128",
            "--data",
            corpus / "eval.txt",
            *FAST_BOOT,
        ]
    )
    assert r.exit_code == 0, r.output
    ds = xr.load_dataset(out / "track.nc")
    assert ds["run"].values.tolist() == ["revs"] and list(ds["step"].values) == SNAP_STEPS
    assert ds["tokens"].values.ravel().tolist() == [128.0 * s for s in SNAP_STEPS]
    assert np.isnan(ds["val_loss"]).all()
    one = xr.load_dataset(_track(runs["preln"], corpus, tmp_path / "ref"))
    np.testing.assert_array_equal(ds["causal_score"].values, one["causal_score"].values)
    r = invoke(["track", ckpts[1], ckpts[0], ckpts[2], "--metric", "causal", "--out", tmp_path / "bad"])
    assert "steps must increase" in one_error_line(r) and not (tmp_path / "bad").exists()


def _track(run: Path, corpus: Path, out: Path) -> Path:
    r = invoke(["track", run, "--metric", "causal", "--out", out, "--data", corpus / "eval.txt", *FAST_BOOT])
    assert r.exit_code == 0, r.output
    return out / "track.nc"


# --- bad input: one line, exit 1, nothing written -----------------------------------------------------------


def _mixed(run: Path, tmp: Path) -> Path:
    bad = copy_run(run, tmp / "mixed")
    m = build_model(ModelConfig.debug("hc", n_layer=4, d_model=32, n_head=2, vocab_size=257, max_seq_len=32))
    d = bad / "snapshots" / "step_0000004"
    meta = (d / "snapshot.json").read_text()
    shutil.rmtree(d)
    depthlens.save(m, d, extra_files={"snapshot.json": meta})
    return bad


def _gap(run: Path, tmp: Path) -> Path:  # the requested steps come from the run's own checkpoint/train.json
    bad = copy_run(run, tmp / "gap")
    shutil.rmtree(bad / "snapshots" / "step_0000004")
    return bad


def _unrequested(run: Path, tmp: Path) -> Path:
    (tmp / "recipe.json").write_text(json.dumps({"steps": 8, "snapshots": [2, 8]}))
    return run


def _empty(run: Path, tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _empty_snapshots(run: Path, tmp: Path) -> Path:
    (tmp / "es" / "snapshots").mkdir(parents=True)
    return tmp / "es"


def _step_mismatch(run: Path, tmp: Path) -> Path:
    bad = copy_run(run, tmp / "mm")
    p = bad / "snapshots" / "step_0000004" / "snapshot.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "step": 5}))
    return bad


def _tokens_backwards(run: Path, tmp: Path) -> Path:
    bad = copy_run(run, tmp / "tb")
    p = bad / "snapshots" / "step_0000008" / "snapshot.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "tokens": 1}))
    return bad


@pytest.mark.parametrize(
    "make, needle",
    [
        (_empty, "no snapshots"),
        (_empty_snapshots, "no snapshots"),
        (_mixed, "mixed architectures"),
        (_gap, "gap in steps: step 4"),
        (_unrequested, "step 4 was not requested"),
        (_step_mismatch, "does not match"),
        (_tokens_backwards, "tokens go backwards"),
    ],
)
def test_bad_series_one_line_nothing_written(runs, tmp_path, make, needle):
    src = make(runs["preln"], tmp_path)
    extra = ["--recipe", tmp_path / "recipe.json"] if (tmp_path / "recipe.json").exists() else []
    out = tmp_path / "out"
    line = one_error_line(invoke(["track", src, "--metric", "causal", "--out", out, *extra, *FAST_BOOT]))
    assert needle in line, line
    assert not out.exists()


def test_bad_metric_and_foreign_out_dir(runs, tmp_path):
    one_error_line(invoke(["track", runs["preln"], "--metric", "causal,nope", "--out", tmp_path / "o"]), 2)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    line = one_error_line(
        invoke(["track", runs["preln"], "--metric", "causal", "--out", tmp_path / "busy", *FAST_BOOT])
    )
    assert "not a track output directory" in line and sorted(p.name for p in (tmp_path / "busy").iterdir()) == [
        "notes.txt"
    ]


def test_pending_steps_and_angular_only(runs, corpus, tmp_path):
    """A run still training (requested steps after the last snapshot) is tracked and says so."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"runs": {"preln_l4": {"steps": 16, "snapshots": [*SNAP_STEPS, 16]}}}))
    out = tmp_path / "o"
    r = invoke(
        [
            "track",
            runs["preln"],
            "--metric",
            "angular",
            "--recipe",
            recipe,
            "--out",
            out,
            "--data",
            corpus / "eval.txt",
            *FAST_BOOT,
        ]
    )
    assert r.exit_code == 0, r.output
    text = (out / "README.md").read_text()
    assert "preln_l4: still training (steps [16] requested" in text and (out / "track.png").is_file()
    ds = xr.load_dataset(out / "track.nc")
    assert ds["angular_profile"].dims == ("run", "step", "state") and json.loads(
        str(ds["requested_steps"].values[0])
    ) == [*SNAP_STEPS, 16]


@pytest.mark.slow
def test_gguf_files_in_order(tmp_path, corpus):
    """A public model's revisions saved locally as GGUF files: the step comes from the file name, the last
    step equals a direct analysis of the last file, and a different architecture in the list is refused."""
    from depthlens.diagnostics.sweep import headline
    from depthlens.studies import api
    from gguf_tiny import tiny_llama, write_tiny_gguf

    revs = [write_tiny_gguf(tiny_llama(seed=s), tmp_path / f"tiny-step{100 * (s + 1)}.gguf") for s in range(2)]
    out = tmp_path / "g"
    text = corpus / "eval.txt"
    r = invoke(
        ["track", *revs, "--metric", "causal", "--out", out, "--data", text, "--tokens-per-step", "1000", *FAST_BOOT]
    )
    assert r.exit_code == 0, r.output
    ds = xr.load_dataset(out / "track.nc")
    assert list(ds["step"].values) == [100, 200] and ds["tokens"].values.ravel().tolist() == [1e5, 2e5]
    model, ck = api.load_model(revs[-1])
    ev = api.eval_data_for(model, text, ck, n_seq=4, seq_len=16, seed=0)
    direct = api.causal(revs[-1], ev, layers="all")
    got = ds.sel(run=ds["run"].values[0], step=200)
    np.testing.assert_array_equal(
        got["causal_score"].values, direct["causal_score"].sel(aggregator="max", variant="current").values
    )
    assert float(got["causal_share"]) == headline(direct, "causal", 0.45, n_boot=FAST_N_BOOT, seed=0)["share"]
    deeper = write_tiny_gguf(tiny_llama(seed=2, n_layer=2), tmp_path / "tiny-step300.gguf")
    line = one_error_line(invoke(["track", *revs, deeper, "--metric", "causal", "--out", tmp_path / "bad", *FAST_BOOT]))
    assert "mixed architectures" in line and not (tmp_path / "bad").exists()


def test_check_validates_without_writing(runs, tmp_path):
    train_json = runs["preln"] / "checkpoint" / "train.json"  # the recipe as trained, found by run name
    r = invoke(["track", runs["preln"], runs["hc"], "--check", "--recipe", train_json, "--out", tmp_path / "o"])
    assert r.exit_code != 0 and "no --recipe names the run 'hc_l4'" in r.stderr
    r = invoke(["track", runs["preln"], "--check", "--recipe", train_json, "--out", tmp_path / "o"])
    assert r.exit_code == 0 and "preln_l4: 3 snapshots, steps [2, 4, 8]; requested by" in r.stdout
    assert not (tmp_path / "o").exists()


def test_undefined_share_is_said_not_hidden(corpus, tmp_path):
    """L = 1 has no late pair: the share is NaN in the dataset and the section says why."""
    ckpts = [
        depthlens.save(
            build_model(ModelConfig.debug("preln", n_layer=1, vocab_size=257, max_seq_len=32), seed=s),
            tmp_path / "one" / f"step{s + 1}",
        )
        for s in range(2)
    ]
    out = tmp_path / "o"
    r = invoke(["track", *ckpts, "--metric", "causal", "--out", out, "--data", corpus / "eval.txt", *FAST_BOOT])
    assert r.exit_code == 0, r.output
    ds = xr.load_dataset(out / "track.nc")
    assert np.isnan(ds["causal_share"]).all() and np.isnan(ds["tokens"]).all() and list(ds["step"].values) == [1, 2]
    assert (
        "one: no causal share at some steps (fewer than 2 layers in the late window)" in (out / "README.md").read_text()
    )

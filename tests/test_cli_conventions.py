"""CLI conventions a newcomer expects: -h, --version, shell completion, tables that keep every digit in a pipe,
default outputs in one git-ignored folder, the command line recorded as given, `prepare --out a/b` making `a/`,
`sweep` ranking robustness only against a given order, and `train` from a fresh clone (corpus built on first use,
or the exact command that builds it)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from helpers import FAST, FAST_NO_BOOT

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def run(args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def cli(*args, cwd, env=None, timeout=300):
    """The real `depthlens` process (what a shell runs), importing this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "depthlens.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def tiny(tiny_ckpt):
    return {a: tiny_ckpt(a) for a in ("preln", "hc")}


def test_short_help_version_and_completion():
    long, short = run(["--help"]), run(["-h"])
    assert long.exit_code == short.exit_code == 0 and long.stdout == short.stdout and "causal" in short.stdout
    assert run(["causal", "-h"]).stdout == run(["causal", "--help"]).stdout
    v = run(["--version"])
    assert v.exit_code == 0 and v.stdout.strip() == f"depthlens {depthlens.__version__}"
    assert "--install-completion" in long.stdout and "--show-completion" in long.stdout


def test_completion_completes_command_names(tmp_path):
    r = cli(
        cwd=tmp_path, env={"_DEPTHLENS_COMPLETE": "complete_bash", "COMP_WORDS": "depthlens cau", "COMP_CWORD": "1"}
    )
    assert r.returncode == 0 and r.stdout.split() == ["causal"], (r.stdout, r.stderr)


def test_piped_table_keeps_every_digit(tmp_path):
    """Independent check: the numbers the planner computes appear whole in the 80-column piped output."""
    from depthlens.training.shapes import plan

    r = cli("shapes", "--target", "407M", "--depths", "16,70", cwd=tmp_path, env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    for row in plan(407e6, depths=[16, 70]):
        for cell in (f"{row.total / 1e6:.1f}M", f"{row.non_embedding / 1e6:.1f}M", f"{row.kv_cache_bytes / 1e6:.1f}"):
            assert cell in r.stdout, (cell, r.stdout)


def test_default_output_folder_and_command_attr(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(["causal", tiny["hc"], "--layers", "late", "--unit", "attn", *FAST_NO_BOOT])
    assert r.exit_code == 0, r.output
    out = tmp_path / "depthlens-out" / "hc_l4.causal.nc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["depthlens-out"]  # nothing in the working directory
    with xr.open_dataset(out) as ds:
        cmd = shlex.split(ds.attrs["command"])
    assert cmd[:3] == ["depthlens", "causal", str(tiny["hc"])]
    given = dict(zip(cmd[3::2], cmd[4::2]))
    assert given == {"--layers": "late", "--unit": "attn", "--n-seq": "2", "--seq-len": "16", "--n-boot": "0"}
    ignore = (ROOT / ".gitignore").read_text().split()
    assert "depthlens-out/" in ignore


def test_a_failed_command_leaves_no_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(["causal", tmp_path / "missing", *FAST_NO_BOOT])
    assert r.exit_code == 1 and not any(tmp_path.iterdir())


def test_prepare_creates_parent_directories(tmp_path):
    (tmp_path / "a.txt").write_text("first document\n" * 50)
    (tmp_path / "b.txt").write_text("second document\n" * 50)
    r = cli("prepare", "a.txt", "b.txt", "--out", "data/mine", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "data" / "mine" / "manifest.json").is_file()
    assert json.loads(r.stdout)["out"] == "data/mine"


def test_sweep_ranking_only_against_a_given_order(tiny, tmp_path):
    base = ["sweep", tiny["preln"], tiny["hc"], "--thresholds", "0:1:0.1", *FAST, "--json"]
    plain = run([*base, "--out", tmp_path / "a.nc"])
    assert plain.exit_code == 0, plain.output
    assert "ranking_fraction" not in json.loads(plain.stdout)
    with xr.open_dataset(tmp_path / "a.nc") as ds:
        assert "ranking_fraction" not in ds.attrs
        share = ds["share"].sel(window_start="quarter", aggregator="max", variant="current")
        s_pre, s_hc = share.sel(checkpoint="preln_l4").values, share.sel(checkpoint="hc_l4").values
    text = run([*base[:-1], "--out", tmp_path / "t.nc"]).stdout
    assert "holds on" not in text and "--order" in text
    given = run([*base, "--out", tmp_path / "b.nc", "--order", "hc_l4,preln_l4"])
    h = json.loads(given.stdout)
    assert h["ranking_order"] == ["hc_l4", "preln_l4"]
    # independent: the fraction of grid points where hc's share < preln's share (strict order, as sweep.robustness)
    import numpy as np

    assert h["ranking_fraction"] == pytest.approx(float(np.mean(s_hc < s_pre)))


# --- train from a fresh clone -----------------------------------------------------------------------------


def _recipe(tmp_path: Path, corpus: bool) -> Path:
    base = {
        "model": {"arch": "preln", "d_model": 32, "n_layer": 2, "n_head": 2, "vocab_size": 257, "max_seq_len": 32},
        "data": "cache/corpus",
        "tokenizer": "bytes",
        "seq_len": 32,
        "global_batch": 4,
        "steps": 3,
        "lr": 3e-3,
        "warmup": 1,
        "eval_every": 0,
        "final_eval_batches": 1,
        "log_every": 1,
        "threads": 1,
    }
    recipe = {"base": base, "runs": {"tiny": {"out": "runs/tiny", "export": "ckpt/tiny"}}}
    if corpus:
        recipe["corpus"] = {
            "source": "packages",
            "tokenizer": "bytes",
            "max_bytes": 30000,
            "val_fraction": 0.05,
            "seed": 0,
        }
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    return path


@pytest.mark.slow
def test_train_builds_the_recipe_corpus_on_first_use(tmp_path, monkeypatch):
    from depthlens.data.corpus import build_corpus
    from depthlens.data.shards import read_manifest
    from depthlens.data.tokenizers import get_tokenizer

    monkeypatch.chdir(tmp_path)  # the recipe's paths are relative, as in the committed recipes
    r = run(["train", _recipe(tmp_path, corpus=True), "--run", "tiny", "--json"])
    assert r.exit_code == 0, r.output
    assert "building the recipe's corpus into cache/corpus" in r.stderr and "corpus ready" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps"] == 3
    assert (tmp_path / "ckpt" / "tiny" / "model.safetensors").is_file()
    # the same data as the library's own build of that corpus block
    ref = build_corpus(tmp_path / "ref", get_tokenizer("bytes"), max_bytes=30000, val_fraction=0.05, seed=0)
    assert read_manifest(tmp_path / "cache" / "corpus")["data_hash"] == ref["data_hash"]
    again = run(["train", _recipe(tmp_path, corpus=True), "--run", "tiny"])
    assert again.exit_code == 0 and "building" not in again.stderr  # built once


def test_train_without_corpus_block_names_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(["train", _recipe(tmp_path, corpus=False), "--run", "tiny"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and "Traceback" not in r.output, r.output
    cmd = lines[0].split("`")[1]  # the first quoted command: run it exactly as printed
    assert cmd.startswith("depthlens prepare --out cache/corpus")
    built = run(shlex.split(cmd)[1:])
    assert built.exit_code == 0, built.output
    assert run(["train", _recipe(tmp_path, corpus=False), "--run", "tiny"]).exit_code == 0

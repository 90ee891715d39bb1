"""Outputs never land on inputs, and --overwrite deletes only what depthlens wrote (the data-at-risk cases of
issue 35): a checkpoint directory is never an output and nothing is written inside one; a report replaces only a
report and keeps (refuses over) a user's own file in it; a marker names what it marks (`contents`), so a copy of
one beside a user's files makes nothing replaceable; `adopt` takes a dataset only whole; a recipe run whose
overrides change the training never writes the recipe's own export. Every refusal is one line before any work,
and the user's files are byte-identical afterwards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.errors import DepthlensError, SchemaError
from depthlens.io import atomic
from helpers import FAST
from test_owned_outputs import ck, one_line, snapshot  # noqa: F401  (ck is a fixture)


def _report(path: Path, **files: str) -> Path:
    """A directory written whole by depthlens, as a report (what `report` leaves, in miniature)."""
    with atomic.atomic_dir(path, kind="report") as tmp:
        for name, text in {"README.md": "# report\n", "manifest.json": "{}\n", **files}.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
    return path


@pytest.fixture()
def plain_ckpt(ck, tmp_path) -> Path:  # noqa: F811
    """A checkpoint directory without any marker (a clone's, or one made elsewhere)."""
    d = tmp_path / "ckpts" / "preln_l4"
    shutil.copytree(ck, d)
    (d / atomic.MARKER).unlink(missing_ok=True)
    return d


def test_nothing_is_written_inside_or_onto_a_checkpoint(plain_ckpt, tmp_path):
    runner = CliRunner()
    before = snapshot(plain_ckpt.parent)
    cases = [
        (["report", str(plain_ckpt), "--out", str(plain_ckpt / "rep"), *FAST], "inside the model checkpoint"),
        (["report", str(plain_ckpt), "--out", str(plain_ckpt), "--overwrite", *FAST], "refusing"),
        (["causal", str(plain_ckpt), "-o", str(plain_ckpt / "c.nc"), *FAST], "inside the model checkpoint"),
        (["track", str(plain_ckpt), "--out", str(plain_ckpt / "tr")], "inside the model checkpoint"),
    ]
    for args, what in cases:
        line = one_line(runner.invoke(app, args))
        assert what in line and str(plain_ckpt) in line, (args, line)
    for kinds in (("report",), ("dataset",), ("netCDF dataset",), ("figure",), None):
        with pytest.raises(DepthlensError, match="checkpoint"):
            atomic.check_target(plain_ckpt, True, kinds=kinds)
        with pytest.raises(DepthlensError, match="inside the model checkpoint"):
            atomic.check_target(plain_ckpt / "sub" / "x", True, kinds=kinds, make_parents=True)
    for kind in ("track", "run", "track cache"):
        with pytest.raises(DepthlensError, match="inside the model checkpoint"):
            atomic.claim_dir(plain_ckpt / "t", kind)
    assert snapshot(plain_ckpt.parent) == before


def test_report_overwrite_keeps_a_users_file_by_refusing_and_naming_it(ck, tmp_path):  # noqa: F811
    out = _report(tmp_path / "rep")
    (out / "notes.md").write_text("my notes, keep them\n")
    before = snapshot(out)
    line = one_line(CliRunner().invoke(app, ["report", str(ck), "--out", str(out), "--overwrite", *FAST]))
    assert "notes.md" in line and "did not write" in line
    assert snapshot(out) == before
    (out / "README.md").write_text("# report, edited by me\n")  # an edited file of ours is the user's now
    (out / "notes.md").unlink()
    with pytest.raises(DepthlensError, match="README.md"):
        atomic.check_target(out, True, kinds=("report",))
    clean = _report(tmp_path / "rep2", **{"data/x.txt": "x"})
    assert atomic.check_target(clean, True, kinds=("report",)) == clean  # only ours: replaceable


def test_a_report_replaces_only_a_report(tmp_path):
    with atomic.atomic_dir(tmp_path / "ds", kind="dataset") as t:
        (t / "manifest.json").write_text("{}")
    with pytest.raises(DepthlensError, match="a depthlens dataset, not a report"):
        atomic.check_target(tmp_path / "ds", True, kinds=("report",))
    marker = json.loads((tmp_path / "ds" / atomic.MARKER).read_text())
    assert marker["kind"] == "dataset" and marker["contents"] == {
        "manifest.json": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    }


@pytest.mark.parametrize("legacy", [False, True])
def test_a_forged_marker_copied_beside_a_users_files_lets_nothing_be_deleted(tmp_path, legacy):
    rep = _report(tmp_path / "rep")
    user = tmp_path / "mine"
    user.mkdir()
    (user / "README.md").write_text("my own readme\n")
    (user / "thesis.tex").write_text("\\section{mine}\n")
    marker = json.loads((rep / atomic.MARKER).read_text())
    if legacy:  # a marker of a depthlens from before `contents`
        marker.pop("contents")
    (user / atomic.MARKER).write_text(json.dumps(marker))
    before = snapshot(user)
    with pytest.raises(DepthlensError) as e:
        atomic.check_target(user, True, kinds=("report",))
    assert "did not write" in str(e.value) and "thesis.tex" in str(e.value)
    with pytest.raises(DepthlensError), atomic.atomic_dir(user, overwrite=True, kinds=("report",)) as tmp:
        (tmp / "README.md").write_text("replaced")
    assert snapshot(user) == before


def _dataset(d: Path) -> Path:
    d.mkdir()
    (d / "tokenizer").mkdir()
    (d / "tokenizer" / "vocab.json").write_text("{}")
    (d / "train_000.bin").write_bytes(b"\0" * 16)
    man = {"tokenizer": {"dir": "tokenizer"}, "splits": {"train": {"shards": [{"file": "train_000.bin"}]}}}
    (d / "manifest.json").write_text(json.dumps(man))
    return d


def test_adopt_takes_a_dataset_only_whole(tmp_path):
    only_manifest = tmp_path / "a"
    only_manifest.mkdir()
    (only_manifest / "manifest.json").write_text(json.dumps({"shards": ["x.bin"]}))
    (only_manifest / "mine.txt").write_text("mine")
    extra = _dataset(tmp_path / "b")
    (extra / "mine.txt").write_text("mine")
    for d in (only_manifest, extra):
        before = snapshot(d)
        with pytest.raises(DepthlensError, match="not recognisably depthlens output"):
            atomic.adopt(d)
        assert snapshot(d) == before and not (d / atomic.MARKER).exists()
    whole = _dataset(tmp_path / "c")
    assert "marked as depthlens dataset" in atomic.adopt(whole)
    assert atomic.check_target(whole, True, kinds=("dataset",)) == whole
    (whole / "later.txt").write_text("added after adopting")
    with pytest.raises(DepthlensError, match="later.txt"):
        atomic.check_target(whole, True, kinds=("dataset",))


def _recipe(tmp_path: Path, export: Path) -> Path:
    r = tmp_path / "recipe.json"
    base = {
        "model": {"arch": "preln", "d_model": 32, "n_head": 2, "n_layer": 2},
        "steps": 400,
        "seq_len": 16,
        "warmup": 1,
    }
    r.write_text(json.dumps({"base": base, "runs": {"preln_l2": {"export": str(export), "out": str(tmp_path / "r")}}}))
    return r


def test_a_changed_training_never_lands_on_the_recipes_export(tmp_path, plain_ckpt):
    from depthlens.training.outputs import check_recipe_export

    r = _recipe(tmp_path, plain_ckpt)
    for over in (["steps=3"], ["lr=1e-2"], ["seed=4"], ["data=elsewhere"], ["model.n_layer=4", "log_every=5"]):
        with pytest.raises(SchemaError) as e:
            check_recipe_export(r, over, "preln_l2")
        assert e.value.usage and str(plain_ckpt) in str(e.value) and "export=PATH" in str(e.value)
    for over in ([], ["log_every=5", "eval_every=10"], ["steps=3", f"export={tmp_path / 'elsewhere'}"]):
        check_recipe_export(r, over, "preln_l2")
    before = snapshot(plain_ckpt)
    line = one_line(CliRunner().invoke(app, ["train", str(r), "run=preln_l2", "steps=3"]), code=2)
    assert "steps" in line and "export=PATH" in line and str(r) in line
    assert snapshot(plain_ckpt) == before and not (tmp_path / "r").exists()


def test_the_documented_hash_limit():
    from depthlens.io.ownership import HASHED_BYTES

    assert HASHED_BYTES == 64 << 20  # docs/quickstart.md: "the size of one over 64 MiB"

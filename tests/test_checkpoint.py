"""Checkpoints: bit-exact round trip, atomic save, and one clear error per bad input (API and CLI)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.errors import CheckpointError
from depthlens.io.checkpoint import load, save
from depthlens.models import ModelConfig, build_model


@pytest.fixture()
def ckpt(tmp_path):
    m = build_model(ModelConfig.debug("keel"), seed=1)
    return save(m, tmp_path / "keel_l4", train={"final_val_loss": 3.21, "seed": 1}), m


def test_round_trip_is_bit_exact(ckpt):
    path, m = ckpt
    ck = load(path)
    a, b = m.state_dict(), ck.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ck.config == m.config
    assert ck.train["final_val_loss"] == 3.21
    toks = torch.randint(0, 97, (1, 9))
    assert torch.equal(ck.model(toks), m.eval()(toks))


def test_tied_embeddings_round_trip(tmp_path):
    m = build_model(ModelConfig.debug("preln", tie_embeddings=True))
    ck = load(save(m, tmp_path / "tied"))
    assert ck.model.lm_head.weight is ck.model.embed_tokens.weight
    assert torch.equal(ck.model.lm_head.weight, m.lm_head.weight)


def test_save_refuses_to_overwrite_and_leaves_no_temp(ckpt):
    path, m = ckpt
    with pytest.raises(CheckpointError, match="already exists"):
        save(m, path)
    save(m, path, overwrite=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["keel_l4"]


def _break(path, how):
    w = path / "model.safetensors"
    if how == "missing_dir":
        shutil.rmtree(path)
    elif how == "missing_config":
        (path / "config.json").unlink()
    elif how == "missing_weights":
        w.unlink()
    elif how == "empty_weights":
        w.write_bytes(b"")
    elif how == "truncated":
        data = w.read_bytes()
        w.write_bytes(data[: len(data) // 2])
    elif how == "corrupt_config":
        (path / "config.json").write_text("{not json")
    elif how == "unknown_design":
        meta = json.loads((path / "config.json").read_text())
        meta["model"]["arch"] = "postln"
        (path / "config.json").write_text(json.dumps(meta))
    elif how == "shape_mismatch":
        meta = json.loads((path / "config.json").read_text())
        meta["model"]["d_model"] = 64
        (path / "config.json").write_text(json.dumps(meta))
    elif how == "missing_tensor":
        t = load_file(str(w))
        t.pop("blocks.0.attn.fn.q_proj.weight")
        save_file(t, str(w))
    elif how == "nan":
        t = load_file(str(w))
        t["blocks.1.mlp.fn.up_proj.weight"][0, 0] = float("nan")
        save_file(t, str(w))
    elif how == "not_a_dir":
        shutil.rmtree(path)
        path.write_text("x")


CASES = {
    "missing_dir": "no such checkpoint",
    "missing_config": "missing config.json",
    "missing_weights": "missing model.safetensors",
    "empty_weights": "unreadable safetensors",
    "truncated": "unreadable safetensors",
    "corrupt_config": "not valid JSON",
    "unknown_design": "field 'model.arch': expected one of .*got 'postln'",
    "shape_mismatch": "shape",
    "missing_tensor": "missing 1 tensor",
    "nan": "NaN or Inf",
    "not_a_dir": "is a directory",
}


@pytest.mark.parametrize("how", sorted(CASES))
def test_bad_checkpoint_gives_clear_error(ckpt, how):
    path, _ = ckpt
    _break(path, how)
    with pytest.raises(CheckpointError, match=CASES[how].replace("(", r"\(")) as e:
        load(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("how", sorted(CASES))
def test_cli_bad_checkpoint_one_line_no_traceback(ckpt, how):
    path, _ = ckpt
    _break(path, how)
    r = CliRunner().invoke(app, ["info", str(path)])
    assert r.exit_code == 1
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthlens: error:"), r.stderr
    assert "Traceback" not in r.output


def test_cli_info_json(ckpt):
    path, m = ckpt
    r = CliRunner().invoke(app, ["info", str(path), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["design"] == "keel" and s["n_layer"] == 4
    assert s["params_total"] == sum(p.numel() for p in m.parameters())
    assert s["params_design_overhead"] == (2 * 4 - 1) * 32  # KEEL: (2L - 1) d outer-norm gains


def test_cli_hooks_lists_hook_points(ckpt):
    path, _ = ckpt
    r = CliRunner().invoke(app, ["hooks", str(path)])
    assert r.exit_code == 0, r.output
    assert "blocks.3.hook_resid_post" in r.stdout and "rms" in r.stdout

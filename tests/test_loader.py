"""The one loader (depthlens.adapters.load): depthlens dirs, HF dirs and GGUF files by path; safety at load;
every CLI command on all three kinds, offline."""

from __future__ import annotations

import json
import os
import pickle
import time

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import depthlens
from depthlens.adapters.load import open_model, opened_of
from depthlens.errors import CheckpointError
from depthlens.models import ModelConfig, build_model
from gguf_tiny import byte_vocab, tiny_llama, write_tiny_gguf
from helpers import FAST_NO_BOOT


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{kind: path}: a native checkpoint, an HF directory (with tokenizer files) and a GGUF file of one LLaMA,
    plus a text file to evaluate on."""
    root = tmp_path_factory.mktemp("sources")
    hf = tiny_llama(seed=0)
    gguf_path = write_tiny_gguf(hf, root / "tiny.F32.gguf")
    (root / "hf").mkdir()
    hf.save_pretrained(str(root / "hf"), safe_serialization=True)
    open_model(gguf_path).tokenizer.tok.save_pretrained(str(root / "hf"))
    native = depthlens.save(
        build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=64), seed=0), root / "native_l4"
    )
    text = root / "eval.txt"
    text.write_text("the cat sat on the mat and then the dog sat on the cat. " * 40, encoding="utf-8")
    return {"native": native, "hf": root / "hf", "gguf": gguf_path, "text": text, "ref": hf}


# --- GGUF ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quant, tol", [("F32", 1e-5), ("F16", 2e-3), ("Q8_0", 5e-2)])
def test_gguf_logits_match_the_source_model(tmp_path, quant, tol):
    hf = tiny_llama(seed=1)
    op = open_model(write_tiny_gguf(hf, tmp_path / f"t.{quant}.gguf", quant=quant))
    x = torch.randint(0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        err = (op.model(x) - hf(x).logits).abs().max().item()
    assert err <= tol, err
    if quant != "F32":
        assert err > 0  # really dequantised, not a float copy
    p = op.provenance
    assert (p["model_source"], p["weights_format"], p["gguf_quantization"], p["adapter_path"]) == (
        "gguf",
        "gguf",
        quant,
        "hand-mapped",
    )
    assert op.meta.kind == "gguf" and op.meta.family == "llama" and op.model.n_layer == 4
    assert opened_of(op.model) is op and depthlens.open is open_model


def test_gguf_parsed_once_loads_the_same_model(tmp_path, monkeypatch):
    """`gguf_parsed_once` (one parse per file, one tensor-name map per arch) changes nothing but the time: the
    same weights and tokenizer as transformers' own repeated parses, one parse counted, `gguf` restored."""
    import contextlib

    import gguf

    from depthlens.adapters import load as L

    path = write_tiny_gguf(tiny_llama(seed=2), tmp_path / "t.Q8_0.gguf", quant="Q8_0")
    parses = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: parses.append(a) or real(*a, **k))
    fast = open_model(path)
    assert len(parses) == 1 and gguf.GGUFReader is not real  # our counter is back in place, not the memo
    monkeypatch.setattr(L, "gguf_parsed_once", contextlib.nullcontext)
    slow = open_model(path, cache=False)  # the GGUF cache would answer without parsing
    assert len(parses) >= 3  # what transformers does on its own: a parse for each of config, weights, tokenizer
    a, b = fast.model.state_dict(), slow.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert fast.tokenizer.name == slow.tokenizer.name


def test_gguf_tokenizer_comes_from_the_file(sources):
    op = open_model(sources["gguf"])
    tok = op.tokenizer
    assert tok.vocab_size == len(byte_vocab()) and tok.bos_id == 1 and tok.adds_bos
    ids = tok.encode("the cat")
    assert tok.decode(ids) == "the cat" and byte_vocab().index("the") in ids
    assert op.provenance["model_bos_id"] == 1 and op.provenance["model_tokenizer"].startswith("gguf-")


def test_gguf_header_sizes_checked_before_loading(tmp_path):
    p = write_tiny_gguf(tiny_llama(), tmp_path / "lying.gguf", block_count=200_000)
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError, match="block_count=200000, the file holds 4 layer"):
        open_model(p)
    assert time.perf_counter() - t0 < 5


def test_gguf_results_record_quantisation(sources):
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    data = EvalData.from_tokens(torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(0)))
    ds = api.permutation(sources["gguf"], data, layers="all")
    assert ds.attrs["gguf_quantization"] == "F32" and ds.attrs["model_source"] == "gguf"
    assert ds.attrs["adapter_path"] == "hand-mapped" and ds.attrs["model_bos_id"] == 1


# --- safety --------------------------------------------------------------------------------------------


class _Boom:
    """Unpickling this would create the marker file: proof that nothing was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_only_directory_is_refused_without_unpickling(tmp_path, sources):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text((sources["hf"] / "config.json").read_text())
    marker = tmp_path / "unpickled"
    for name in ("pytorch_model.bin", "extra.pt"):
        (d / name).write_bytes(pickle.dumps(_Boom(str(marker))))
    with pytest.raises(CheckpointError) as e:
        open_model(d)
    msg = str(e.value)
    assert "\n" not in msg and "pickle" in msg and "save_pretrained" in msg and "safe_serialization=True" in msg
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="not a GGUF file.*pickle"):
        open_model(d / "pytorch_model.bin")
    assert not marker.exists()


def _copy_hf(src, dst, edit_config=None, edit_weights=None):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if edit_config:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if edit_weights:
        sd = load_file(str(dst / "model.safetensors"))
        edit_weights(sd)
        save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_nan_and_non_float_weights_are_refused(tmp_path, sources):
    def nan(sd):
        sd["model.layers.2.mlp.up_proj.weight"][0, 0] = float("nan")

    def ints(sd):
        sd["model.norm.weight"] = sd["model.norm.weight"].to(torch.int32)

    with pytest.raises(CheckpointError, match=r"model.layers.2.mlp.up_proj.weight contains NaN or Inf"):
        open_model(_copy_hf(sources["hf"], tmp_path / "nan", edit_weights=nan))
    with pytest.raises(CheckpointError, match=r"model.norm.weight has dtype I32"):
        open_model(_copy_hf(sources["hf"], tmp_path / "int", edit_weights=ints))
    # the same for a native checkpoint and for a GGUF file
    m = build_model(ModelConfig.debug("preln"), seed=0)
    native = depthlens.save(m, tmp_path / "native")
    from safetensors.torch import load_file, save_file

    sd = load_file(str(native / "model.safetensors"))
    sd["blocks.1.attn.fn.q_proj.weight"][0, 0] = float("inf")
    save_file(sd, str(native / "model.safetensors"))
    with pytest.raises(CheckpointError, match="contains NaN or Inf"):
        open_model(native)
    hf = tiny_llama()
    with torch.no_grad():
        hf.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="down_proj.weight contains NaN or Inf"):
        open_model(write_tiny_gguf(hf, tmp_path / "nan.gguf"))


def test_config_sizes_are_checked_before_allocation(tmp_path, sources):
    def huge(cfg):
        cfg["num_hidden_layers"] = 200_000

    t0 = time.perf_counter()
    with pytest.raises(CheckpointError, match="num_hidden_layers=200000, the safetensors files hold 4 layer"):
        open_model(_copy_hf(sources["hf"], tmp_path / "huge", edit_config=huge))
    native = tmp_path / "native_huge"
    import shutil

    shutil.copytree(sources["native"], native)
    cfg = json.loads((native / "config.json").read_text())
    cfg["model"]["n_layer"] = 200_000
    (native / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="n_layer=200000, the weight file holds 4 layer"):
        open_model(native)

    def wide(cfg):
        cfg["hidden_size"] = 4096

    with pytest.raises(CheckpointError, match="implies"):
        open_model(_copy_hf(sources["hf"], tmp_path / "wide", edit_config=wide))
    assert time.perf_counter() - t0 < 10


def test_remote_code_never_runs(tmp_path, sources):
    d = tmp_path / "remote"

    def custom(cfg):
        cfg["model_type"] = "my_custom_lm"
        cfg["auto_map"] = {"AutoConfig": "modeling_x.XConfig", "AutoModelForCausalLM": "modeling_x.XModel"}

    _copy_hf(sources["hf"], d, edit_config=custom)
    marker = tmp_path / "ran"
    (d / "modeling_x.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(CheckpointError) as e:
        open_model(d)
    assert "\n" not in str(e.value) and not marker.exists()


# --- the CLI on all three kinds ------------------------------------------------------------------------


def _run(args):
    from depthlens.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("kind", ["native", "hf", "gguf"])
def test_cli_info_and_hooks(sources, kind):
    r = _run(["info", sources[kind], "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["n_layer"] == 4 and s["model_source"] == {"native": "depthlens"}.get(kind, kind)
    assert s["params_total"] == sum(p.numel() for p in open_model(sources[kind]).model.parameters())
    if kind == "gguf":
        assert s["gguf_quantization"] == "F32"
    r = _run(["hooks", sources[kind]])
    assert r.exit_code == 0, r.output
    assert "blocks.3.hook_resid_post" in r.stdout


@pytest.mark.parametrize("kind", ["native", "hf", "gguf"])
def test_cli_causal_permute_report(sources, kind, tmp_path):
    for cmd in ("causal", "permute"):
        out = tmp_path / f"{cmd}.nc"
        r = _run([cmd, sources[kind], "--data", sources["text"], "--out", out, "--json", *FAST_NO_BOOT])
        assert r.exit_code == 0, r.output
        assert 0 <= json.loads(r.stdout)["share"] <= 1 and out.is_file()
    import xarray as xr

    with xr.open_dataset(tmp_path / "causal.nc") as ds:
        assert ds.attrs["model_source"] == {"native": "depthlens"}.get(kind, kind)
        assert ds.attrs["model_path"] == str(sources[kind].resolve())
    r = _run(
        [
            "report",
            sources[kind],
            "--out",
            tmp_path / "rep",
            "--data",
            sources["text"],
            "--n-seq",
            "2",
            "--seq-len",
            "16",
            "--n-boot",
            "0",
            "--metrics",
            "causal,permutation",
        ]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "rep" / "summary.json").is_file()


def test_cli_hf_and_gguf_give_the_same_numbers(sources, tmp_path):
    """One LLaMA, two containers: the F32 GGUF and the HF directory must give identical results."""
    heads = {}
    for kind in ("hf", "gguf"):
        r = _run(
            [
                "causal",
                sources[kind],
                "--data",
                sources["text"],
                "--out",
                tmp_path / f"{kind}.nc",
                "--json",
                *FAST_NO_BOOT,
            ]
        )
        assert r.exit_code == 0, r.output
        heads[kind] = json.loads(r.stdout)
    import xarray as xr

    with xr.open_dataset(tmp_path / "hf.nc") as a, xr.open_dataset(tmp_path / "gguf.nc") as b:
        np.testing.assert_allclose(a["causal_score"].values, b["causal_score"].values, atol=1e-5)
    assert heads["hf"]["share"] == heads["gguf"]["share"]


@pytest.mark.parametrize("cmd", ["info", "hooks", "causal", "permute", "report", "eval"])
def test_cli_refuses_pickle_and_nan_with_one_line(sources, tmp_path, cmd):
    bad = tmp_path / "pickled"
    bad.mkdir()
    (bad / "config.json").write_text((sources["hf"] / "config.json").read_text())
    (bad / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))

    def nan(sd):
        sd["model.embed_tokens.weight"][3, 3] = float("nan")

    nanned = _copy_hf(sources["hf"], tmp_path / "nan", edit_weights=nan)
    for path, what in ((bad, "pickle"), (nanned, "NaN")):
        out = tmp_path / f"out-{cmd}-{what}"
        extra = {"causal": ["--out", out], "permute": ["--out", out], "report": ["--out", out]}.get(cmd, [])
        before = set(os.listdir(tmp_path))
        r = _run([cmd, path, *extra])
        assert r.exit_code == 1, (r.exit_code, r.output)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("depthlens: error:") and what in lines[0], r.stderr
        assert set(os.listdir(tmp_path)) == before and not out.exists()

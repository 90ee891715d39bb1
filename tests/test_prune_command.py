"""`depthlens prune`: a tiny Hugging Face Llama and a depthlens checkpoint pruned, reloaded by their own loaders
(plain transformers for the HF model) and their held-out loss recomputed independently against the certificate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from depthlens.cli import app
from depthlens.runtime.evaldata import load_eval_data

N_SEQ, SEQ_LEN = 16, 32
L = 6


def run(args):
    return CliRunner().invoke(app, ["prune", *[str(a) for a in args]])


@pytest.fixture(autouse=True)
def _journals_in_tmp(tmp_path, monkeypatch):
    """Each test's cut journals under its own tmp folder (same key as the command's), not the user's cache."""
    from depthlens.cli import prune as cli_prune

    real = cli_prune._journal_dir
    monkeypatch.setattr(cli_prune, "_journal_dir", lambda *a: tmp_path / "journals" / real(*a).name)


def _tokens(cert):
    """The certificate's eval windows, redrawn as the command drew them, checked against its hashes."""
    ev = cert["eval_data"]
    data = load_eval_data(None, "bytes", n_seq=ev["n_seq"], seq_len=ev["seq_len"], seed=ev["eval_seed"])
    assert data.sha256 == ev["sha256"]
    return data.tokens[ev["heldout_sequences"]]


def _nll(logits, toks):
    """Mean next-token NLL over positions 0..T-2 of each sequence, then over sequences (float64)."""
    lg = logits[:, :-1].double()
    nll = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), toks[:, 1:].reshape(-1), reduction="none")
    return float(nll.reshape(toks.shape[0], -1).mean(1).mean())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=257,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=256,
        eos_token_id=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # layers of unequal weight: later layers write more
        for l, layer in enumerate(hf.model.layers):
            layer.mlp.down_proj.weight.mul_(0.5 + 2 * l)
    d = tmp_path_factory.mktemp("llama") / "tiny"
    hf.save_pretrained(d, safe_serialization=True)
    return d, hf


def test_prune_hf_llama_reloads_in_plain_transformers(llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    src, orig = llama_dir
    out = tmp_path / "pruned"
    r = run(
        [src, "--tolerance", "0.5", "--out", out, "--criterion", "skip_loss", "--n-seq", N_SEQ, "--seq-len", SEQ_LEN]
    )
    assert r.exit_code == 0, r.output
    cert = json.loads((out / "prune_certificate.json").read_text())
    k, removed = cert["k"], cert["layers_removed"]
    assert k >= 1 and len(removed) == k and cert["criterion"] == "skip_loss"
    assert set(cert["result"]) == {"pooled", "english", "code"}
    for s, res in cert["result"].items():
        assert res["upper_bound"] <= 0.5 and res["delta"] <= res["upper_bound"]
        assert cert["k_within_tolerance"][s] >= k
    pruned = AutoModelForCausalLM.from_pretrained(out).eval()
    assert pruned.config.num_hidden_layers == L - k
    kept = [l for l in range(L) if l not in removed]
    for i, layer in enumerate(pruned.model.layers):
        assert layer.self_attn.layer_idx == i
        torch.testing.assert_close(layer.mlp.down_proj.weight, orig.model.layers[kept[i]].mlp.down_proj.weight)
    toks = _tokens(cert)
    with torch.no_grad():
        loss = _nll(pruned(toks).logits, toks)
        clean = _nll(orig(toks).logits, toks)
    assert loss == pytest.approx(cert["result"]["pooled"]["pruned_loss"], abs=1e-5)
    assert clean == pytest.approx(cert["result"]["pooled"]["clean_loss"], abs=1e-5)
    assert cert["model"]["format"] == "hf" and cert["model"]["input_format"] == "hf"
    assert "one-sided" in cert["method"]["bound"] and "fixed-sequence" in cert["method"]["selection"]


def test_prune_depthlens_checkpoint(tmp_path):
    import depthlens
    from depthlens.models import ModelConfig, build_model

    model = build_model(ModelConfig.debug("preln", n_layer=L, vocab_size=257, max_seq_len=64), seed=1).eval()
    with torch.no_grad():
        for l, block in enumerate(model.blocks):
            block.mlp.fn.down_proj.weight.mul_(0.2 + l)
    src = tmp_path / "ck"
    depthlens.save(model, src)
    out = tmp_path / "pruned"
    r = run([src, "--tolerance", "1.0", "--out", out, "--n-seq", N_SEQ, "--seq-len", SEQ_LEN, "--json"])
    assert r.exit_code == 0, r.output
    cert = json.loads((out / "prune_certificate.json").read_text())
    assert cert["criterion"] == "greedy" and cert["k"] >= 1
    small = depthlens.load(out).model.eval()
    assert small.config.n_layer == L - cert["k"]
    toks = _tokens(cert)
    with torch.no_grad():
        loss = _nll(small(toks), toks)
    assert loss == pytest.approx(cert["result"]["pooled"]["pruned_loss"], abs=1e-5)
    assert cert["model"]["format"] == "depthlens"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tolerance", "0"], "--tolerance must be a finite number > 0"),
        (["--tolerance", "-1"], "--tolerance must be a finite number > 0"),
        (["--tolerance", "0.1", "--criterion", "magic"], "--criterion must be one of"),
    ],
)
def test_bad_options_one_line(llama_dir, tmp_path, extra, message):
    src, _ = llama_dir
    r = run([src, "--out", tmp_path / "x", *extra])
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_output_is_the_input_directory(llama_dir):
    src, _ = llama_dir
    for out in (src, src / "inside"):
        r = run([src, "--tolerance", "0.1", "--out", out])
        assert r.exit_code == 2 and "input model's own directory" in r.output
        assert len(r.output.strip().splitlines()) == 1


def test_nothing_within_tolerance_writes_nothing(llama_dir, tmp_path):
    src, _ = llama_dir
    out = tmp_path / "none"
    r = run([src, "--tolerance", "1e-9", "--out", out, "--n-seq", N_SEQ, "--seq-len", SEQ_LEN, "--k-max", "1"])
    assert r.exit_code == 1 and "no layer can go" in r.output and not out.exists()
    assert len(r.output.strip().splitlines()) == 1
    assert not any(p.name.startswith(".none.") for p in tmp_path.iterdir())  # no temporary left


def test_certificate_bound_recounted():
    """The bound of each step is the one-sided t bound of the per-window Δloss (recounted by hand from the
    definition on made-up numbers through `upper_bound`'s formula)."""
    from scipy import stats

    from depthlens.diagnostics.pruning_heldout import upper_bound

    d = np.array([0.02, 0.05, -0.01, 0.03, 0.04])
    n = len(d)
    mean = sum(d) / n
    sd = (sum((x - mean) ** 2 for x in d) / (n - 1)) ** 0.5
    assert upper_bound(d) == pytest.approx(mean + stats.t.ppf(0.95, n - 1) * sd / n**0.5)


def test_prune_gguf_writes_an_hf_directory(tmp_path):
    """A GGUF input is written as a Hugging Face directory (the float weights depthlens measured; no GGUF writer):
    plain transformers loads it with L - k layers, and its held-out loss is the certificate's."""
    from transformers import AutoModelForCausalLM

    from depthlens.adapters.load import open_model
    from gguf_tiny import tiny_llama, write_tiny_gguf

    hf = tiny_llama(seed=4, n_layer=L)
    with torch.no_grad():
        for l, layer in enumerate(hf.model.layers):
            layer.mlp.down_proj.weight.mul_(0.5 + 2 * l)
    gguf = write_tiny_gguf(hf, tmp_path / "tiny.F32.gguf")
    text = tmp_path / "eval.txt"
    text.write_text(" ".join(f"the cat sat on the mat {i} times and then the dog ran" for i in range(200)))
    out = tmp_path / "pruned"
    args = [gguf, "--tolerance", "5", "--out", out, "--data", text, "--n-seq", "8", "--seq-len", "24", "--k-max", "2"]
    r = run(args)
    assert r.exit_code == 0, r.output
    cert = json.loads((out / "prune_certificate.json").read_text())
    assert cert["model"]["input_format"] == "gguf" and cert["model"]["format"] == "hf"
    assert set(cert["result"]) == {"pooled"}  # a plain text file: one domain
    pruned = AutoModelForCausalLM.from_pretrained(out).eval()
    assert pruned.config.num_hidden_layers == L - cert["k"] and cert["k"] >= 1
    op = open_model(gguf)
    data = load_eval_data(text, op.tokenizer, n_seq=8, seq_len=24, seed=0)
    assert data.sha256 == cert["eval_data"]["sha256"]
    toks = data.tokens[cert["eval_data"]["heldout_sequences"]]
    with torch.no_grad():
        loss = _nll(pruned(toks).logits, toks)
    assert loss == pytest.approx(cert["result"]["pooled"]["pruned_loss"], abs=1e-5)


def test_a_second_prune_replays_the_cuts_of_the_first(llama_dir, tmp_path, monkeypatch):
    """A rerun on the same model and eval data (after a stop, or with another tolerance) replays every cut the
    first run computed: it runs only the clean passes, says so on stderr, and certifies the same steps."""
    from depthlens.diagnostics import pruning
    from helpers import count_calls

    src, _ = llama_dir
    calls = count_calls(monkeypatch, pruning, "_sequence_nll")
    common = ["--n-seq", N_SEQ, "--seq-len", SEQ_LEN, "--k-max", "3", "--json"]
    first = run([src, "--tolerance", "10", "--out", tmp_path / "a", *common])
    assert first.exit_code == 0, first.output
    assert "replaying" not in first.stderr
    fresh_calls, calls[0] = calls[0], 0
    second = run([src, "--tolerance", "5", "--out", tmp_path / "b", *common])
    assert second.exit_code == 0, second.output
    assert "replaying up to" in second.stderr
    a, b = (json.loads((tmp_path / d / "prune_certificate.json").read_text()) for d in ("a", "b"))
    assert a["steps"] == b["steps"] and a["k"] == b["k"] == 3
    # one batch per fold: only each fold's clean pass (which ties the journal to this model) runs again
    assert calls[0] == 2 < fresh_calls

"""Foreign-model adapters: tiny HF models (LLaMA, Qwen2, Qwen3, Mistral, GPT-2) built offline from configs,
saved with safetensors, loaded back by path, and run through the LayeredLM protocol and the engine. docs/foreign-models.md
quotes the logits tolerance (1e-5)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from depthlens.errors import CheckpointError

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2"]
B, T = 2, 12


def _tokens(seed: int = 0, b: int = B, t: int = T) -> torch.Tensor:
    return torch.randint(0, 101, (b, t), generator=torch.Generator().manual_seed(seed))


def _hf_model(model_type: str, seed: int = 0, **overrides):
    """A tiny random HF model whose norm gains and biases are moved off their init (a misplaced norm shows)."""
    from transformers import AutoModelForCausalLM

    from depthlens.adapters.hf import debug_config

    if model_type == "mistral":
        overrides.setdefault("sliding_window", 5)  # shorter than T: the sliding mask matters
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(debug_config(model_type, **overrides)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if n.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
    return m


def _tokenizer(directory, bos: bool) -> None:
    """An HF tokenizer saved into `directory`: LLaMA-like word-level one that prepends <s> (bos=True), or a
    Qwen-like byte-level BPE with no BOS (AutoTokenizer then builds the family's own tokenizer class)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if bos:
        words = ["<s>", "</s>", "<unk>"] + ["the", "a", "cat", "dog", "sat", "on", "mat"]
        tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
        fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    else:
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        tk.train_from_iterator(
            ["the cat sat on the mat", "a dog sat"] * 5,
            trainers.BpeTrainer(
                vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
            ),
        )
        fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    fast.save_pretrained(str(directory))


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{family: directory} of saved tiny models; llama ships a BOS tokenizer, qwen2 a BOS-less one."""
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(fam)
        _hf_model(fam).save_pretrained(str(d), safe_serialization=True)
        if fam in ("llama", "qwen2"):
            _tokenizer(d, bos=fam == "llama")
        out[fam] = d
    return out


@pytest.fixture(scope="module")
def loaded(hf_dirs):
    from depthlens.adapters import load_hf

    return {fam: load_hf(d) for fam, d in hf_dirs.items()}


def _merge_hook(positions: slice):
    """HF forward hook: the layer's output := its input on `positions` (Csordas' merge_io)."""

    def hook(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        out = out.clone()
        out[:, positions] = args[0][:, positions]
        return (out, *output[1:]) if isinstance(output, tuple) else out

    return hook


# --- protocol ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
def test_protocol_reproduces_hf_logits(loaded, fam):
    from depthlens.models.protocol import LayeredLM

    w = loaded[fam]
    assert isinstance(w, LayeredLM) and w.n_layer == 4 and w.design.slug == "preln"
    toks = _tokens()
    with torch.no_grad():
        ref = w.hf(toks).logits
        ctx = w.context(T)
        ups = []
        out = w.head(w.run_layers(w.embed(toks, ctx), ctx, on_layer=lambda p, s, u: ups.append(u)), ctx)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w(toks), ref, rtol=1e-5, atol=1e-5)
    assert len(ups) == 4 and ups[0].shape == (B, T, 32)
    # prefix reuse: start at layer 2 from the cached state before layer 2
    with torch.no_grad():
        s2 = w.run_layers(w.embed(toks, ctx), ctx, 0, 2)
        torch.testing.assert_close(w.head(w.run_layers(s2, ctx, 2), ctx), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fam", FAMILIES)
def test_unembedding_is_the_hf_head(loaded, fam):
    """The head split at its matmul (what the vocabulary-chunked loss walks) is the HF head exactly."""
    import torch.nn.functional as F

    from depthlens.models.protocol import unembedding_of

    w = loaded[fam]
    with torch.no_grad():
        ctx = w.context(T)
        state = w.run_layers(w.embed(_tokens(), ctx), ctx)
        u = unembedding_of(w)
        torch.testing.assert_close(F.linear(u.hidden(state, ctx), u.weight, u.bias), w.head(state, ctx), rtol=0, atol=0)


@pytest.mark.parametrize("fam", FAMILIES)
def test_keep_mask_equals_an_hf_layer_hook_skip(loaded, fam):
    w = loaded[fam]
    toks = _tokens(1)
    keep = torch.ones(B, T)
    keep[:, 1:] = 0
    with torch.no_grad():
        ctx = w.context(T)
        ups, states = {}, {}
        skipped = w.head(
            w.run_layers(
                w.embed(toks, ctx),
                ctx,
                keep={2: keep},
                on_layer=lambda p, s, u: (ups.__setitem__(p, u), states.__setitem__(p, s["h"])),
            ),
            ctx,
        )
        handle = w.layers[2].register_forward_hook(_merge_hook(slice(1, None)))
        try:
            ref = w.hf(toks).logits
        finally:
            handle.remove()
        clean = w(toks)
    torch.testing.assert_close(skipped, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(skipped, clean, atol=1e-4)
    assert torch.count_nonzero(ups[2][:, 1:]) == 0 and torch.count_nonzero(ups[2][:, 0]) > 0
    torch.testing.assert_close(states[2][:, 1:], states[1][:, 1:], rtol=0, atol=0)  # skipped tokens keep their input
    torch.testing.assert_close(w(toks, keep={2: torch.ones(B, T)}), clean)  # all-ones keep is a no-op


@pytest.mark.parametrize("fam", ["llama", "gpt2"])
@pytest.mark.parametrize("unit", ["attn", "mlp"])
def test_sublayer_keep_masks_only_drop_that_sublayer(loaded, fam, unit):
    w = loaded[fam]
    toks = _tokens(2)
    keep = torch.ones(B, T)
    keep[:, 1:] = 0
    sub = getattr(w.layers[1], w.spec.attn if unit == "attn" else w.spec.mlp)

    def zero(module, args, output):
        out = (output[0] if isinstance(output, tuple) else output).clone()
        out[:, 1:] = 0
        return (out, *output[1:]) if isinstance(output, tuple) else out

    with torch.no_grad():
        got = w(toks, keep={1: keep}, unit=unit)
        handle = sub.register_forward_hook(zero)
        try:
            ref = w.hf(toks).logits
        finally:
            handle.remove()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fam", FAMILIES)
def test_order_runs_layers_in_the_given_order(loaded, fam):
    from torch import nn

    w = loaded[fam]
    toks = _tokens(3)
    order = [0, 2, 1, 3]
    with torch.no_grad():
        clean = w(toks)
        swapped = w(toks, order=order, swap="body")
        torch.testing.assert_close(w(toks, order=order, swap="all"), swapped)  # no routers: body == all
        torch.testing.assert_close(w(toks, order=list(range(4))), clean)
        parent_path, _, name = w.spec.blocks.rpartition(".")
        parent = w.hf.get_submodule(parent_path)
        original = getattr(parent, name)
        setattr(parent, name, nn.ModuleList([original[i] for i in order]))
        try:
            ref = w.hf(toks).logits
        finally:
            setattr(parent, name, original)
    torch.testing.assert_close(swapped, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(swapped, clean, atol=1e-4)
    with pytest.raises(ValueError, match="permutation"):
        w(toks, order=[0, 0, 1, 2])


def _captured_states(w, toks):
    """h_0..h_L captured with plain torch hooks on the HF decoder layers (h_L = last layer's output)."""
    states = []
    hs = [layer.register_forward_pre_hook(lambda m, args: states.append(args[0].detach())) for layer in w.layers]
    hs.append(
        w.layers[-1].register_forward_hook(
            lambda m, args, out: states.append((out[0] if isinstance(out, tuple) else out).detach())
        )
    )
    try:
        with torch.no_grad():
            hidden = w.hf(toks, output_hidden_states=True).hidden_states
    finally:
        for h in hs:
            h.remove()
    return torch.stack(states), hidden


@pytest.mark.parametrize("fam", FAMILIES)
def test_angular_distance_equals_hook_capture(loaded, fam):
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    w = loaded[fam]
    toks = _tokens(4, b=3, t=10)
    ds = api.angular(w, EvalData.from_tokens(toks), positions="last")
    states, hidden = _captured_states(w, toks)  # (L+1, B, T, d)
    # HF hidden_states are h_0..h_{L-1} then norm(h_L): the last entry is after the final norm
    # (docs/concepts.md#notation)
    torch.testing.assert_close(torch.stack(hidden[:4]), states[:4])
    final_norm = w.hf.get_submodule(w.spec.final_norm)
    torch.testing.assert_close(hidden[4], final_norm(states[4]))
    assert not torch.allclose(hidden[4], states[4])
    x = states[:, :, -1].double()  # last position
    cos = torch.nn.functional.cosine_similarity(x[:, None], x[None, :], dim=-1).clamp(-1, 1)  # (L+1, L+1, B)
    direct = (torch.arccos(cos) / torch.pi).mean(-1)
    for n in range(1, 5):
        for l in range(0, 5 - n):
            got = ds.angular_distance.sel(layer=l, block_size=n).item()
            assert got == pytest.approx(direct[l, l + n].item(), abs=1e-5)


@pytest.mark.parametrize("fam", FAMILIES)
def test_every_diagnostic_runs_on_foreign_models(hf_dirs, fam):
    import numpy as np

    from depthlens.adapters import load_any
    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    model, meta = load_any(hf_dirs[fam])
    data = EvalData.from_tokens(_tokens(5, b=2, t=16))
    C = api.causal(model, data)
    S = api.layer_skip_loss(model, data)
    P = api.permutation(model, data, layers="all")
    A = api.angular(model, data)
    cm = C.causal_score.sel(variant="current", aggregator="max").values
    assert (
        np.allclose(np.diag(cm), 1.0)
        and np.isnan(cm[np.tril_indices(4, -1)]).all()  # t < s: not measured
        and np.all(cm[np.triu_indices(4, 1)] > 0)
    )
    assert np.isfinite(S.skip_delta_loss.values).all() and S.skip_delta_loss.shape == (4,)
    assert P.attrs["design"] == "preln" and np.isfinite(A.angular_distance.values[:4, 1]).all()
    assert meta.kind == "hf" and meta.family == fam and meta.arch == "preln" and meta.n_layer == 4


# --- loading, dispatch, errors ----------------------------------------------------------------------------


def test_load_any_dispatches_on_config(tmp_path, hf_dirs):
    from depthlens.adapters import ModelMeta, load_any
    from depthlens.adapters.hf import HFLayeredModel
    from depthlens.io import checkpoint
    from depthlens.models import DepthModel, ModelConfig, build_model

    native = tmp_path / "preln_l4"
    checkpoint.save(build_model(ModelConfig.debug("preln")), native)
    m, meta = load_any(native)
    assert isinstance(m, DepthModel) and isinstance(meta, ModelMeta)
    assert (meta.kind, meta.arch, meta.n_layer, meta.name) == ("depthlens", "preln", 4, "preln_l4")
    m, meta = load_any(hf_dirs["qwen3"])
    assert isinstance(m, HFLayeredModel) and (meta.kind, meta.family) == ("hf", "qwen3")
    assert set(meta.attrs()) >= {"model_kind", "model_family", "checkpoint", "arch", "n_layer", "bos_id"}
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"hello": 1}')
    with pytest.raises(CheckpointError, match="neither a depthlens"):
        load_any(tmp_path / "odd")


def _corrupt_cases(tmp_path, good):
    import shutil

    def copy(name):
        d = tmp_path / name
        shutil.copytree(good, d)
        return d

    cases = {"missing": tmp_path / "nope"}
    f = tmp_path / "file"
    f.write_text("x")
    cases["file"] = f
    d = copy("noconfig")
    (d / "config.json").unlink()
    cases["noconfig"] = d
    d = copy("badjson")
    (d / "config.json").write_text("{not json")
    cases["badjson"] = d
    d = copy("family")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "bert"  # a causal LM transformers knows (generic path), but not these weights
    (d / "config.json").write_text(json.dumps(cfg))
    cases["family"] = d
    d = copy("noweights")
    (d / "model.safetensors").unlink()
    cases["noweights"] = d
    d = copy("truncated")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases["truncated"] = d
    d = copy("missingtensor")
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / "model.safetensors"))
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    cases["missingtensor"] = d
    return cases


def test_load_hf_errors_are_one_line(tmp_path, hf_dirs):
    from depthlens.adapters import load_any, load_hf

    expect = {
        "missing": ("no such model directory", "no such checkpoint directory or GGUF file"),
        "file": ("is a directory", "not a GGUF file"),
        "noconfig": "missing config.json",
        "badjson": "not valid JSON",
        "family": "weights do not match",
        "noweights": "no weights|no \\*.safetensors",
        "truncated": "cannot load HF model|lies outside the file",
        "missingtensor": "1 missing",
    }
    for name, path in _corrupt_cases(tmp_path, hf_dirs["llama"]).items():
        for k, loader in enumerate((load_hf, load_any)):
            with pytest.raises(CheckpointError) as e:
                loader(path)
            msg, want = str(e.value), expect[name]
            want = want[k] if isinstance(want, tuple) else want
            assert "\n" not in msg and re.search(want, msg) and str(path) in msg, (name, msg)


# --- tokenizers ----------------------------------------------------------------------------------------


def test_tokenizer_files_and_bos_convention(hf_dirs, loaded):
    from depthlens.adapters import load_any
    from depthlens.data.tokenizers import Tokenizer

    _, meta = load_any(hf_dirs["llama"])
    tok = meta.tokenizer
    assert isinstance(tok, Tokenizer) and tok.adds_bos and meta.bos_id == tok.bos_id == 0
    assert tok.encode("the cat sat") == [3, 5, 7]  # encode never adds specials; the packer prepends bos_id
    assert loaded["llama"].to_tokens(["the cat", "a dog sat"]).tolist() == [[0, 3, 5, 1], [0, 4, 6, 7]]
    _, meta = load_any(hf_dirs["qwen2"])
    qtok = meta.tokenizer
    assert qtok.adds_bos is False and meta.bos_id is None  # Qwen: position 0 is a real token
    ids = qtok.encode("the cat sat")
    assert ids == qtok.tok("the cat sat")["input_ids"] and qtok.decode(ids) == "the cat sat"
    assert loaded["qwen2"].to_tokens("the cat sat").tolist() == [ids]
    assert load_any(hf_dirs["gpt2"])[1].tokenizer is None  # no tokenizer files shipped
    with pytest.raises(ValueError, match="without tokenizer"):
        loaded["gpt2"].to_tokens("x")
    assert meta.tokenizer.name.startswith("hf-") and meta.tokenizer.name != tok.name


# --- key maps and import guards -------------------------------------------------------------------------


def test_key_maps_are_explicit_and_complete(loaded):
    from depthlens.adapters.base import invert, map_key, rename
    from depthlens.adapters.families import spec_for
    from depthlens.models import ModelConfig, build_model

    llama = spec_for("llama")
    sd = loaded["llama"].hf.state_dict()
    renamed = rename(sd, llama.key_map, what="llama->depthlens")
    native = build_model(ModelConfig.debug("preln", d_model=32, n_head=4, n_kv_head=2, d_ff=64, vocab_size=101))
    assert set(renamed) == set(native.state_dict())
    assert set(rename(renamed, invert(llama.key_map), what="back")) == set(sd)
    assert llama.importable and spec_for("mistral").importable
    for fam in ("qwen2", "qwen3"):
        spec = spec_for(fam)
        assert not spec.importable
        extra = [k for k in loaded[fam].hf.state_dict() if map_key(k, spec.key_map) == (True, None)]
        assert extra and set(loaded[fam].hf.state_dict()) == {
            k for k in loaded[fam].hf.state_dict() if map_key(k, spec.key_map)[0]
        }
        with pytest.raises(CheckpointError, match="no depthlens counterpart"):
            rename(loaded[fam].hf.state_dict(), spec.key_map, what=fam)
    assert spec_for("gpt2").key_map == {} and not spec_for("gpt2").importable


def test_import_refuses_models_depthlens_cannot_represent(hf_dirs, tmp_path):
    from depthlens.adapters import import_llama

    with pytest.raises(CheckpointError, match="only llama/mistral"):
        import_llama(hf_dirs["qwen2"])
    with pytest.raises(CheckpointError, match="sliding_window 5 is active"):
        import_llama(hf_dirs["mistral"])
    _hf_model("mistral", sliding_window=None).save_pretrained(str(tmp_path / "m"))
    m = import_llama(tmp_path / "m")
    assert m.config.arch == "preln" and m.config.n_kv_head == 2


def test_eval_data_is_packed_with_the_models_own_tokenizer(hf_dirs, loaded, tmp_path):
    """What `depthlens causal <hf dir>` needs: the loader's tokenizer -> load_eval_data -> any diagnostic."""
    from depthlens.adapters import open_model
    from depthlens.runtime.evaldata import load_eval_data
    from depthlens.studies import api

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(["the cat sat on the mat a dog sat"] * 20))
    tok = open_model(hf_dirs["llama"]).tokenizer
    data = load_eval_data(text, tok, n_seq=3, seq_len=8, max_seq_len=loaded["llama"].config.max_seq_len)
    assert (data.tokens[:, 0] == 0).all() and data.bos and int(data.tokens.max()) < 10  # <s> at position 0
    ds = api.angular(loaded["llama"], data)
    assert ds.attrs["design"] == "preln" and ds.angular_distance.shape == (5, 5)
    assert open_model(hf_dirs["gpt2"]).tokenizer is None


# --- the CLI on a foreign checkpoint (issue: `depthlens causal path/to/hf_model --threshold 0.45`) ----------


@pytest.mark.parametrize("fam", ["llama"])  # the qwen2 fixture tokenizer (280 ids) outgrows its 101-id model
def test_cli_causal_on_hf_directory_with_its_tokenizer(hf_dirs, tmp_path, fam):
    import json

    from typer.testing import CliRunner

    from depthlens.cli import app

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(f"w{i % 37}" for i in range(3000)))
    out = tmp_path / "c.nc"
    r = CliRunner().invoke(
        app,
        [
            "causal",
            str(hf_dirs[fam]),
            "--threshold",
            "0.45",
            "--data",
            str(text),
            "--n-seq",
            "2",
            "--seq-len",
            "16",
            "--n-boot",
            "20",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    h = json.loads(r.stdout)
    assert h["n_pairs"] == 3 and 0 <= h["share"] <= 1 and out.exists()


def test_cli_refuses_hf_model_without_tokenizer_on_text(hf_dirs, tmp_path):
    from typer.testing import CliRunner

    from depthlens.cli import app

    text = tmp_path / "eval.txt"
    text.write_text("some words " * 200)
    r = CliRunner().invoke(
        app,
        [
            "angular",
            str(hf_dirs["mistral"]),
            "--data",
            str(text),
            "--n-seq",
            "2",
            "--seq-len",
            "16",
            "--out",
            str(tmp_path / "a.nc"),
        ],
    )
    assert r.exit_code == 1 and "no tokenizer" in r.stderr and not (tmp_path / "a.nc").exists()

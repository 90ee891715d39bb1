"""A model described by its embed, blocks and head (`depthlens.wrap`, docs/own-model.md), checked against a plain
forward-hook loop written here: the same causal, permutation and angular results, keep/order semantics, and every
refusal of a bad description."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import depthlens
import depthlens.errors
from depthlens.adapters.described import DescribedModel, DescriptionError
from depthlens.diagnostics.angular.engine import angular_distances
from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.runtime.evaldata import EvalData
from helpers import FAST

# The user's model, as a user writes it: a tiny Pre-LN GPT in plain PyTorch (LayerNorm, GELU MLP, learned
# positions). Also written to a file for the command-line tests.
TINY_SRC = """
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, d, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, d // self.h).unbind(2)
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.o(y.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attn(d)
        self.ln2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=257, d=32, n_layer=4, ctx=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def embed(self, tokens):
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))

    def head(self, x):
        return self.lm_head(self.ln_f(x))

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def describe():
    import depthlens

    net = TinyLM()
    return depthlens.wrap(net, embed=net.embed, blocks=net.blocks, head=net.head,
                          sublayers=lambda b: (b.attn, b.mlp), design="tiny_preln", max_seq_len=64)
"""

NS: dict = {}
exec(compile(TINY_SRC, "tiny_model", "exec"), NS)  # noqa: S102 (the test's own source)
TinyLM = NS["TinyLM"]


def _net(seed: int = 0, n_layer: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    net = TinyLM(n_layer=n_layer).eval()
    with torch.no_grad():  # larger weights than the default init, so every layer matters
        for p in net.parameters():
            p.mul_(3.0 if p.dim() > 1 else 1.0)
    return net


def _wrap(net: nn.Module, **kw) -> DescribedModel:
    return depthlens.wrap(
        net, embed=net.embed, blocks=net.blocks, head=net.head, sublayers=lambda b: (b.attn, b.mlp), **kw
    )


@pytest.fixture(scope="module")
def net():
    return _net()


@pytest.fixture(scope="module")
def model(net):
    return _wrap(net, design="tiny_preln", max_seq_len=64)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 257, (3, 16), generator=torch.Generator().manual_seed(3))


# --- the plain forward-hook loop: nothing of depthlens ---------------------------------------------------------


def hook_loop(net, tokens, *, skip=None, order=None, unit="block"):
    """(logits, [h_0 .. h_L], [u_0 .. u_{L-1}]) by calling the blocks in `order`; skip = (position, (B, T) bool
    mask of skipped tokens): the writers' outputs are zeroed there by forward hooks."""
    L = len(net.blocks)
    order = list(range(L)) if order is None else order
    h = net.embed(tokens)
    states, updates = [h], []
    for pos in range(L):
        block = net.blocks[order[pos]]
        handles = []
        if skip is not None and skip[0] == pos:
            mask = skip[1]
            writers = {"block": (block.attn, block.mlp), "attn": (block.attn,), "mlp": (block.mlp,)}[unit]
            for w in writers:
                handles.append(
                    w.register_forward_hook(lambda m, a, out, mask=mask: out.masked_fill(mask[..., None], 0))
                )
        try:
            new = block(h)
        finally:
            for hd in handles:
                hd.remove()
        updates.append(new - h)
        states.append(new)
        h = new
    return net.head(h), states, updates


def _nll(logits, tokens):
    return -torch.log_softmax(logits[:, 1:-1].float(), -1).gather(-1, tokens[:, 2:, None]).squeeze(-1)


# --- the same results as the hook loop ---------------------------------------------------------------------------


def test_forward_equals_the_module(net, model, tokens):
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), net(tokens), rtol=0, atol=0)
    assert (model.n_layer, model.d_model, model.vocab_size) == (4, 32, 257)
    assert model.units == ("block", "attn", "mlp") and not model.design.multi_stream


@pytest.mark.parametrize("unit", ["block", "attn", "mlp"])
def test_causal_equals_the_hook_loop(net, model, tokens, unit):
    ds = causal_scores(model, EvalData.from_tokens(tokens), variants=("current",), unit=unit, batch_size=5)
    C = ds.causal_score.sel(variant="current")
    T = tokens.shape[1]
    skip = torch.zeros_like(tokens, dtype=torch.bool)
    skip[:, 1:] = True
    with torch.no_grad():
        _, _, clean = hook_loop(net, tokens)
        for s in range(4):
            _, _, new = hook_loop(net, tokens, skip=(s, skip), unit=unit)
            for t in range(s + 1, 4):
                diff, den = (new[t] - clean[t])[:, 1:T].double(), clean[t][:, 1:T].double()
                r = diff.norm(dim=-1) / den.norm(dim=-1).clamp_min(1e-6)
                pooled = math.sqrt(float(diff.square().sum() / den.square().sum()))
                got = [float(C.sel(aggregator=a).values[s, t]) for a in ("max", "mean", "pooled")]
                np.testing.assert_allclose(got, [float(r.max()), float(r.mean()), pooled], rtol=1e-5, atol=1e-6)


def test_permutation_equals_the_hook_loop(net, model, tokens):
    ds = permutation_scores(model, EvalData.from_tokens(tokens), pairs="all", batch_size=4)
    with torch.no_grad():
        base = _nll(hook_loop(net, tokens)[0], tokens).mean()
        for i in range(4):
            for j in range(i + 1, 4):
                order = list(range(4))
                order[i], order[j] = j, i
                want = float(_nll(hook_loop(net, tokens, order=order)[0], tokens).mean() - base)
                assert ds.perm_abs.values[i, j] == pytest.approx(want, abs=1e-5)
    assert abs(ds.perm_abs.values[0, 3]) > 1e-3  # the swaps matter: the check above can fail


def test_angular_equals_the_hook_loop(net, model, tokens):
    ds = angular_distances(model, EvalData.from_tokens(tokens), positions="all")
    with torch.no_grad():
        _, states, _ = hook_loop(net, tokens)
    x = torch.stack(states)[:, :, 1:].double()  # (L+1, B, T-1, d), BOS left out
    for l in range(5):
        for n in range(1, 5 - l):
            a = nn.functional.normalize(x[l], dim=-1)
            b = nn.functional.normalize(x[l + n], dim=-1)
            want = float((torch.arccos((a * b).sum(-1).clamp(-1, 1)) / math.pi).mean())
            assert ds.angular_distance.values[l, n] == pytest.approx(want, abs=1e-5)


def test_run_layers_keep_and_order_equal_a_loop_by_hand(net, model, tokens):
    mask = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(0)) < 0.5
    order = [2, 0, 3, 1]
    got: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        ctx = model.context(tokens.shape[1])
        state = model.run_layers(
            model.embed(tokens, ctx),
            ctx,
            keep={1: (~mask).float()},
            order=order,
            on_layer=lambda p, s, u: got.__setitem__(p, u),
        )
        logits = model.head(state, ctx)
        want_logits, _, want_u = hook_loop(net, tokens, skip=(1, mask), order=order)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-6)
    for p in range(4):
        torch.testing.assert_close(got[p], want_u[p], rtol=0, atol=1e-6)
    assert float(got[1][mask].abs().max()) == 0.0  # a skipped token writes nothing


def test_without_sublayers_a_skip_passes_the_block_input_through(net, tokens):
    model = depthlens.wrap(net, embed=net.embed, blocks=net.blocks, head=net.head)
    assert model.units == ("block",)
    mask = torch.zeros(tokens.shape, dtype=torch.bool)
    mask[:, 3:] = True
    with torch.no_grad():
        ctx = model.context(tokens.shape[1])
        h0 = model.embed(tokens, ctx)
        h1 = model.run_layers(h0, ctx, 0, 1, keep={0: (~mask).float()})["h"]
        clean = net.blocks[0](h0["h"])
    torch.testing.assert_close(h1[mask], h0["h"][mask], rtol=0, atol=0)
    torch.testing.assert_close(h1[~mask], clean[~mask], rtol=0, atol=0)
    with pytest.raises(ValueError, match="sublayers"):
        model.run_layers(h0, ctx, unit="attn")


# --- refusals (item 5): one line each ----------------------------------------------------------------------------


BAD_SRC = """
import torch
from torch import nn

import depthlens
import depthlens.errors


class Toy(nn.Module):
    def __init__(self, blocks, d=8, vocab=11):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(blocks)
        self.out = nn.Linear(d, vocab)


class Grow(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.cat([x, self.lin(x)], -1)


class Peek(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return x + self.lin(x.mean(1, keepdim=True))


def _wrap(toy, **kw):
    return depthlens.wrap(toy, **{"embed": toy.emb, "blocks": toy.blocks, "head": toy.out, **kw})


def grow():
    return _wrap(Toy([Grow()]))


def head():
    return _wrap(Toy([nn.Linear(8, 8)]), head=lambda x: x.sum(-1))


def view():
    return _wrap(Toy([nn.Linear(8, 8)]), view=lambda x: x[..., :4])


def share():
    lin = nn.Linear(8, 8)
    return _wrap(Toy([nn.Sequential(lin), nn.Sequential(lin)]))


def peek():
    return _wrap(Toy([Peek()]))
"""

BAD: dict = {}
exec(compile(BAD_SRC, "bad_models", "exec"), BAD)  # noqa: S102 (the test's own source)


def _bad_descriptions():
    Toy, lin = BAD["Toy"], nn.Linear(8, 8)
    yield "block 0 changes the state's shape", BAD["grow"]
    yield "head returned", BAD["head"]
    yield "view of the embed output", BAD["view"]
    yield "share a module", BAD["share"]
    yield "are one module", lambda: BAD["_wrap"](Toy([lin, lin]))
    yield "not causal", BAD["peek"]
    yield "not a submodule", lambda: BAD["_wrap"](Toy([nn.Linear(8, 8)]), blocks=[nn.Linear(8, 8)])
    yield "own writer modules", lambda: BAD["_wrap"](Toy([lin]), sublayers=lambda b: (nn.Linear(8, 8),))
    yield "design must be a short name", lambda: BAD["_wrap"](Toy([lin]), design="my design")
    maps = {"res_map": torch.eye(2).expand(2, 4, 2, 2)}
    yield (
        "residual maps over 2 streams",
        lambda: BAD["_wrap"](
            Toy([nn.Sequential(nn.Linear(8, 8))]), sublayers=lambda b: (b[0],), mixing=lambda b: [maps] if b else {}
        ),
    )


@pytest.mark.parametrize("match,build", list(_bad_descriptions()), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_descriptions_are_refused_with_one_line(match, build):
    with pytest.raises(DescriptionError, match=match) as e:
        build()
    assert "\n" not in str(e.value)


def test_a_causal_model_is_not_refused_at_any_thread_count(net):
    was = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            _wrap(net)
    finally:
        torch.set_num_threads(was)


# --- from the command line: FILE.py:FUNCTION --weights W --------------------------------------------------------


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """mymodel.py (the tiny Pre-LN model with its describe()), its trained-looking weights, and bad.py."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("own")
    (d / "mymodel.py").write_text(TINY_SRC)
    (d / "bad.py").write_text(BAD_SRC)
    (d / "run").mkdir()
    save_file(_net(seed=1).state_dict(), str(d / "run" / "model.safetensors"))
    torch.save(_net(seed=1).state_dict(), d / "model.pt")
    return d


def _cli(args, cwd):
    import os

    from typer.testing import CliRunner

    from depthlens.cli import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(here)


EVAL = [*FAST, "--threads", "1"]


@pytest.mark.parametrize("command", ["causal", "permute", "angular"])
def test_cli_runs_a_described_model_as_the_api_does(user_dir, command):
    out = user_dir / f"{command}.nc"
    r = _cli([command, "mymodel.py:describe", "--weights", "run/model.safetensors", *EVAL, "-o", out], user_dir)
    assert r.exit_code == 0, r.output
    import xarray as xr

    from depthlens.studies import api

    with xr.open_dataset(out) as ds:
        var = {"causal": "causal_score", "permute": "perm_abs", "angular": "angular_distance"}[command]
        got = ds[var].values
        assert ds.attrs["described_function"] == "describe"
        assert ds.attrs["described_file_sha256"] == _sha(user_dir / "mymodel.py")
        assert ds.attrs["weights_sha256"] == _sha(user_dir / "run" / "model.safetensors")
    ref = f"{user_dir / 'run' / 'model.safetensors'}@{user_dir / 'mymodel.py'}:describe"
    fn = {"causal": api.causal, "permute": api.permutation, "angular": api.angular}[command]
    want = fn(ref, n_seq=2, seq_len=16)[var].values
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)
    if command == "causal":  # the trained weights were loaded, not the function's own init
        own = fn(f"{user_dir / 'mymodel.py'}:describe", n_seq=2, seq_len=16)[var].values
        assert not np.allclose(own, want, equal_nan=True)


def _sha(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _native_l4(tmp_path):
    """A native Pre-LN checkpoint of the described model's shape (4 layers, d = 32, 257 tokens), to report beside it."""
    from depthlens.models.config import ModelConfig
    from depthlens.models.model import build_model

    cfg = ModelConfig(arch="preln", n_layer=4, d_model=32, n_head=2, vocab_size=257, max_seq_len=64)
    return depthlens.save(build_model(cfg, seed=0), tmp_path / "preln_l4")


def test_report_and_compare_put_a_described_model_beside_a_native_one(user_dir, tmp_path):
    native = _native_l4(tmp_path)
    out = tmp_path / "report"
    args = ["report", native, "mymodel.py:describe", "--weights", "run/model.safetensors", *EVAL[:4]]
    r = _cli([*args, "--metrics", "causal", "--n-boot", "0", "-o", out, "--quiet"], user_dir)
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads((out / "summary.json").read_text())
    names = {row["checkpoint"] for row in (rows["rows"] if isinstance(rows, dict) else rows)}
    assert names == {"preln_l4", "mymodel.py_describe"}
    args = ["sweep", native, "mymodel.py:describe", "--weights", "run/model.safetensors", *EVAL[:4], "--json"]
    r = _cli([*args, "-o", tmp_path / "sweep.nc"], user_dir)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["checkpoints"] == ["preln_l4", "mymodel.py_describe"]


def test_weights_pair_with_models_in_order_and_a_bad_pairing_is_a_usage_error(user_dir):
    from depthlens.adapters.userref import pair_weights, parse_ref

    got = pair_weights(["compare", "ck/hc", "a.py:f", "--weights", "w1", "b.py:g", "--weights=w2"])
    assert [parse_ref(a) for a in got[2:]] == [
        parse_ref(f"w1@{user_dir.anchor}" + str(Path("a.py").resolve())[1:] + ":f"),
        parse_ref(f"w2@{Path('b.py').resolve()}:g"),
    ]
    assert parse_ref(got[2]).name == "a.py:f"
    r = _cli(["causal", "mymodel.py:describe", "--weights", "a", "--weights", "b"], user_dir)
    assert r.exit_code == 2 and "2 --weights for 1 FILE.py:FUNCTION" in r.output


def test_a_pickle_is_refused_with_the_conversion_line(user_dir):
    r = _cli(["causal", "mymodel.py:describe", "--weights", "model.pt", *EVAL, "-o", "p.nc"], user_dir)
    assert r.exit_code == 1
    assert "never unpickles" in r.output and "safetensors.torch.save_file(model.state_dict()" in r.output
    assert not (user_dir / "p.nc").exists()


def test_strict_keys_one_line(user_dir, tmp_path):
    from safetensors.torch import save_file

    sd = _net(seed=1).state_dict()
    sd.pop("ln_f.weight")
    sd["extra.weight"] = torch.zeros(2)
    save_file(sd, str(tmp_path / "w.safetensors"))
    r = _cli(["causal", "mymodel.py:describe", "--weights", tmp_path / "w.safetensors", *EVAL], user_dir)
    assert r.exit_code == 1
    assert "missing 'ln_f.weight'" in r.output and "unexpected 'extra.weight'" in r.output


REFUSALS = {
    "grow": "block 0 changes the state's shape",
    "head": "head returned",
    "view": "the view of the embed output",
    "share": "share a module",
    "peek": "not causal",
}


@pytest.mark.parametrize("fn", list(REFUSALS))
def test_bad_descriptions_exit_1_with_one_line_and_no_file(user_dir, fn):
    r = _cli(["causal", f"bad.py:{fn}", *EVAL, "-o", f"{fn}.nc"], user_dir)
    lines = [l for l in r.output.splitlines() if l.strip() and not l.startswith("loading")]
    assert r.exit_code == 1, r.output
    assert len(lines) == 1 and REFUSALS[fn] in lines[0], r.output
    assert not (user_dir / f"{fn}.nc").exists()


@pytest.mark.slow
def test_a_bad_description_in_a_real_process(user_dir):
    """As a user runs it: exit status 1, one line on stderr, no traceback, nothing written."""
    import os
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "depthlens.cli", "causal", "bad.py:peek", *EVAL, "-o", "real.nc"],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("loading")]
    assert p.returncode == 1 and len(lines) == 1 and "not causal" in lines[0], p.stderr
    assert not (user_dir / "real.nc").exists()


def test_code_in_a_checkpoint_directory_never_runs(user_dir, tmp_path):
    """A weights directory (or a checkpoint directory) holding Python files: none of them is imported."""
    from safetensors.torch import save_file

    ck = tmp_path / "ck"
    ck.mkdir()
    marker = tmp_path / "ran"
    for name in ("mymodel.py", "modeling_evil.py", "__init__.py"):
        (ck / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (ck / "config.json").write_text('{"model_type": "evil", "auto_map": {"AutoModelForCausalLM": "modeling_evil.M"}}')
    save_file(_net(seed=1).state_dict(), str(ck / "model.safetensors"))
    r = _cli(["causal", "mymodel.py:describe", "--weights", ck, *EVAL, "-o", tmp_path / "c.nc"], user_dir)
    assert r.exit_code == 0, r.output  # the weights are read from the directory, its mymodel.py is not the one run
    r = _cli(["causal", ck, *EVAL, "-o", tmp_path / "d.nc"], user_dir)
    assert r.exit_code == 1 and not (tmp_path / "d.nc").exists()
    assert not marker.exists()


# --- a native design, described through wrap as a user would, equals itself ---------------------------------------
# The update and skip semantics of the described path (module docstring of depthlens.adapters.described) are those
# of the native designs: Pre-LN, HC and mHC (multistream_skip="mix"), Full AttnRes (attnres_skip="zero_value") run
# through `wrap` give the native causal, permutation (swap="all": a described block moves whole) and angular
# results, and the native effective rank and depth-mixing matrix from the mixing objects.


def _pack(dm, inner, pos):
    """A native state as the user state of its description: one tensor for Pre-LN / HC / mHC; for AttnRes, fixed-size
    buffers with a mask of the filled slots (Full: every output so far; Block: the finished blocks) and the number
    of layers run (the block starts are positional)."""
    arch, L = dm.config.arch, dm.n_layer
    if arch not in ("full_attnres", "block_attnres"):
        return next(iter(inner.values()))
    src = inner["v"] if arch == "full_attnres" else inner["blocks"]
    B, T, K, d = src.shape
    buf = src.new_zeros(B, T, 2 * L + 1, d)
    ok = torch.zeros(B, T, 2 * L + 1, dtype=torch.bool, device=src.device)
    buf[:, :, :K] = src
    ok[:, :, :K] = inner["valid"] if arch == "full_attnres" else True
    done = torch.full((B, T), float(pos), device=src.device)
    return (buf, ok, done) if arch == "full_attnres" else (buf, ok, done, inner["partial"])


def _unpack(dm, state):
    """(the native state, the layer position) of a user state (`_pack`)."""
    arch = dm.config.arch
    if arch not in ("full_attnres", "block_attnres"):
        return ({"x": state} if dm.design.multi_stream else {"h": state}), None
    buf, ok, done = state[:3]
    K = int(ok[0, 0].sum())
    if arch == "full_attnres":
        return {"v": buf[:, :, :K], "valid": ok[:, :, :K]}, int(done[0, 0])
    return {"blocks": buf[:, :, :K], "partial": state[3]}, int(done[0, 0])


class _NativeBlock(nn.Module):
    """One native block as a state -> state module (what a user's own block is); it records its mixing objects."""

    def __init__(self, dm, l):
        super().__init__()
        self.blk, self.l = dm.blocks[l], l
        object.__setattr__(self, "dm", dm)  # not a submodule: the blocks own only their own block
        self.record: dict = {}

    def forward(self, state):
        inner, pos = _unpack(self.dm, state)
        pos = self.l if pos is None else pos
        ctx = self.dm.context(next(iter(inner.values())).shape[1], record=True)
        out, _ = self.blk(inner, design=self.dm.design, pos=pos, ctx=ctx)
        self.record = {**ctx.record, "pos": pos}
        return _pack(self.dm, out, pos + 1)


def _described_native(dm):
    """`dm` (a native DepthModel) described through depthlens.wrap, as a user would describe their own model."""
    from depthlens.models.readouts import readout_key

    holder = nn.Module()
    holder.dm = dm
    holder.blocks = nn.ModuleList(_NativeBlock(dm, l) for l in range(dm.n_layer))
    arch = dm.config.arch
    attnres = arch in ("full_attnres", "block_attnres")
    final_rec: dict = {}

    def embed(tokens):
        return _pack(dm, dm.embed(tokens, dm.context(tokens.shape[1])), 0)

    def final(state):
        inner, _ = _unpack(dm, state)
        ctx = dm.context(next(iter(inner.values())).shape[1], record=True)
        h = dm.final_hidden(inner, ctx)
        final_rec.clear()
        final_rec.update(ctx.record)
        return h

    def head(state):
        return dm.lm_head(dm.final_norm(final(state)))

    names = {"hc": ("res_map", "A_m", "B"), "mhc": ("res_map", "H_pre", "H_post"), "full_attnres": ("alpha",)}
    names["block_attnres"] = ("alpha", "source_labels")

    def mixing(block):
        if block is None:
            return {"alpha": final_rec[readout_key("alpha", final=True)]} if attnres else {}
        rec, out = block.record, []
        for i in range(2):
            j = 2 * rec["pos"] + i
            m = {k: rec[readout_key(k, j)] for k in names[arch]}
            if arch in ("hc", "mhc"):
                m["pre"], m["post"] = m.pop(names[arch][1]), m.pop(names[arch][2])
            out.append(m)
        return out

    def view(state):
        return dm.design.view(_unpack(dm, state)[0])

    return depthlens.wrap(
        holder,
        embed=embed,
        blocks=holder.blocks,
        head=head,
        view=view if arch != "preln" else None,
        sublayers=lambda b: (b.blk.attn, b.blk.mlp),
        mixing=mixing if arch in names else None,
        final=final if attnres else None,
        design=f"described_{arch}",
        max_seq_len=dm.config.max_seq_len,
    )


def _native(arch):
    from helpers import debug_model

    kw = {"hc": {"multistream_skip": "mix"}, "mhc": {"multistream_skip": "mix"}}
    kw["full_attnres"] = {"attnres_skip": "zero_value"}
    kw["block_attnres"] = {"attnres_block_starts": [0, 2]}  # two blocks of two layers: partial sums that matter
    dm = debug_model(arch, n_layer=4, seed=0, **kw.get(arch, {}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # trained-looking AttnRes: non-zero pseudo-queries, so the depth softmaxes are not uniform
        for name, p in dm.named_parameters():
            if "pseudo_query" in name:
                p.normal_(0, 1.0, generator=g)
    return dm


@pytest.mark.parametrize("arch", ["preln", "hc", "mhc", "full_attnres", "block_attnres"])
def test_a_native_design_described_equals_itself(arch):
    dm = _native(arch)
    model = _described_native(dm)
    assert model.design.multi_stream == dm.design.multi_stream
    data = EvalData.from_tokens(
        torch.randint(0, dm.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    )
    for unit in ("block", "attn"):
        a = causal_scores(dm, data, variants=("current",), unit=unit, batch_size=6)
        b = causal_scores(model, data, variants=("current",), unit=unit, batch_size=6)
        np.testing.assert_allclose(b.causal_score.values, a.causal_score.values, rtol=1e-5, atol=1e-5)
    a = permutation_scores(dm, data, pairs="all", swap="all")
    b = permutation_scores(model, data, pairs="all")
    np.testing.assert_allclose(b.perm_abs.values, a.perm_abs.values, rtol=1e-5, atol=1e-5)
    a, b = angular_distances(dm, data, positions="all"), angular_distances(model, data, positions="all")
    np.testing.assert_allclose(b.angular_distance.values, a.angular_distance.values, rtol=1e-5, atol=1e-5)
    if arch != "preln":
        torch.testing.assert_close(model.depth_mixing(data.tokens), dm.depth_mixing(data.tokens), rtol=1e-5, atol=1e-6)
    if arch != "preln":
        from depthlens.diagnostics.attnres.engine import attnres_dataset
        from depthlens.diagnostics.rank.engine import effective_rank_dataset

        engine = attnres_dataset if "attnres" in arch else effective_rank_dataset
        a, b = engine(dm, data), engine(model, data)
        compared = 0
        for v in a.data_vars:
            if a[v].dtype.kind == "f" and v in b:
                np.testing.assert_allclose(b[v].values, a[v].values, rtol=1e-5, atol=1e-6, equal_nan=True)
                compared += 1
        assert compared >= 3


def test_track_follows_a_described_model_over_its_saved_steps(user_dir, tmp_path):
    """`track FILE.py:FUNCTION --weights step_10.safetensors FILE.py:FUNCTION --weights step_20.safetensors`: one
    series, the steps read from the weights' names, each step's causal matrix that of its own weights."""
    import xarray as xr
    from safetensors.torch import save_file

    from depthlens.studies import api

    for step in (10, 20):
        save_file(_net(seed=step).state_dict(), str(tmp_path / f"step_{step}.safetensors"))
    args = ["track"]
    for step in (10, 20):
        args += ["mymodel.py:describe", "--weights", tmp_path / f"step_{step}.safetensors"]
    out = tmp_path / "trk"
    r = _cli([*args, *EVAL[:4], "--metrics", "causal", "--n-boot", "0", "--out", out, "--quiet"], user_dir)
    assert r.exit_code == 0, r.output
    with xr.open_dataset(out / "track.nc") as ds:
        assert list(ds.step.values) == [10, 20]
        var = next(v for v in ds.data_vars if "causal" in v and ds[v].ndim >= 3)
        got = ds[var].values
    for k, step in enumerate((10, 20)):
        ref = f"{tmp_path / f'step_{step}.safetensors'}@{user_dir / 'mymodel.py'}:describe"
        want = api.causal(ref, n_seq=2, seq_len=16).causal_score.sel(variant="current", aggregator="max").values
        np.testing.assert_allclose(got.reshape(-1, *want.shape)[k], want, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_placement_by_device_map(tokens):
    """place(device_map) as for Hugging Face models: the same results on an explicit map (CPU here: every part on
    'cpu'), and a head off the embedding's device refused with one line."""
    net = _net(seed=2)
    model = _wrap(net)
    with torch.no_grad():
        want = model(tokens)
        model.place({"embed": "cpu", "layers": ["cpu"] * 4, "head": "cpu"})
        assert model.placement is not None and model.input_device == torch.device("cpu")
        torch.testing.assert_close(model(tokens), want, rtol=0, atol=0)
    assert model.part_sizes().layers == tuple(sum(p.numel() for p in b.parameters()) for b in net.blocks)
    with pytest.raises(depthlens.errors.DepthlensError, match="head on the embedding's device"):
        model.place({"embed": "cpu", "layers": ["cpu"] * 4, "head": "meta"})


def test_hook_points_read_the_residual_view(net, model, tokens):
    """blocks.{i}.hook_resid_pre/post and hook_resid_final (TransformerLens names) see the hook loop's states; they
    are read-only (an edit is refused with one line: the model's own modules are where to edit)."""
    from depthlens.models.hook_contract import HookError

    with torch.no_grad():
        _, states, _ = hook_loop(net, tokens)
        _, cache = model.run_with_cache(tokens)
    for l in range(4):
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_pre"], states[l], rtol=0, atol=0)
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_post"], states[l + 1], rtol=0, atol=0)
    torch.testing.assert_close(cache["hook_resid_final"], states[4], rtol=0, atol=0)
    assert set(model.hook_names()) >= {"hook_embed", "blocks.0.hook_resid_pre", "hook_resid_final"}
    with pytest.raises(HookError, match="read-only"), torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x * 0)])


# --- what a description does not give is refused with the field, never an all-NaN result ---------------------------


def _rewrapped(model, **changes):
    """`model`'s description with some fields changed, wrapped again over the same module."""
    import dataclasses

    d = model.description
    return depthlens.wrap(model.module, **{**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)}, **changes})


def test_depth_mixing_without_the_mixing_objects_is_refused_naming_the_field(model, tokens):
    """No `mixing`: the depth-mixing matrix cannot be read off blocks seen from outside (refused, not NaN); with
    `mixing` but without what the matrix needs (streams without pre/post, AttnRes without the final readout's
    alpha), the line names what is missing. The complete description gives the native matrix (the control)."""
    from depthlens.diagnostics.mixing.engine import depth_mixing_dataset

    data = EvalData.from_tokens(tokens)
    with pytest.raises(DescriptionError, match="needs the description's `mixing` field") as e:
        depth_mixing_dataset(model, data)
    assert "\n" not in str(e.value)
    hc = _described_native(_native("hc"))
    data = EvalData.from_tokens(tokens[:, :12] % hc.vocab_size)
    streams_only = _rewrapped(
        hc, mixing=lambda b: [{"res_map": m["res_map"]} for m in hc.description.mixing(b)] if b else {}
    )
    with pytest.raises(DescriptionError, match="'pre' and 'post' next to 'res_map'"):
        depth_mixing_dataset(streams_only, data)
    full = _described_native(_native("full_attnres"))
    no_final = _rewrapped(full, mixing=lambda b: full.description.mixing(b) if b is not None else {})
    with pytest.raises(DescriptionError, match=r"`mixing\(None\)` must return \{'alpha'"):
        depth_mixing_dataset(no_final, data)
    M = depth_mixing_dataset(full, data).depth_mixing.values
    assert np.isfinite(M).all() and np.allclose(M.sum(0)[1:], 1.0)  # each input is a softmax mix of its sources


def test_depth_mixing_of_a_model_with_nothing_to_read_is_refused():
    """A model that gives neither a matrix nor depth-mass readouts (a Hugging Face model, say) is refused: the
    engine never writes an all-NaN matrix (MoDA, with depth_mass, keeps its NaN matrix and a note)."""
    from depthlens.diagnostics.mixing.engine import depth_mixing_dataset
    from helpers import debug_model

    inner = debug_model("preln", n_layer=2)

    class Plain:  # the layered-LM core only
        design, n_layer = inner.design, inner.n_layer

        def parameters(self):
            return inner.parameters()

    data = EvalData.from_tokens(torch.randint(0, inner.config.vocab_size, (2, 8), generator=torch.Generator()))
    with pytest.raises(depthlens.errors.DepthlensError, match="no matrix .model.depth_mixing. and no"):
        depth_mixing_dataset(Plain(), data)
    assert np.isfinite(depth_mixing_dataset(inner, data).depth_mixing.values).all()  # native Pre-LN: a matrix


def test_the_lens_refuses_a_state_that_is_not_its_view_and_reads_one_that_is(model, tokens):
    """The logit lens reads h_l through the description's head: a one-tensor state with no view/final is read
    (at l = L the lens is the model's own prediction: KL 0); HC's stream state (a `view`) is refused with one line
    before any work, not a shape error from inside the user's head."""
    from depthlens.diagnostics.lens.engine import logit_lens

    data = EvalData.from_tokens(tokens)
    kl = logit_lens(model, data, n_boot=0).lens_kl.values  # (layer,): sequence means
    assert abs(float(kl[-1])) < 1e-6 and float(kl[0]) > 1e-3
    hc = _described_native(_native("hc"))
    assert model.lens_refusal() is None and "gives `view`" in hc.lens_refusal()
    with pytest.raises(depthlens.errors.DepthlensError, match="gives `view`") as e:
        logit_lens(hc, EvalData.from_tokens(tokens[:, :8] % hc.vocab_size), n_boot=0)
    assert "\n" not in str(e.value)


def test_cli_mixing_on_a_description_without_mixing_exits_1_and_writes_nothing(user_dir):
    r = _cli(["mixing", "mymodel.py:describe", "--weights", "run/model.safetensors", *EVAL, "-o", "mix.nc"], user_dir)
    lines = [l for l in r.output.splitlines() if l.strip() and not l.startswith("loading")]
    assert r.exit_code == 1, r.output
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:") and "`mixing` field" in lines[0], r.output
    assert not (user_dir / "mix.nc").exists()


# --- beside the zoo in a report: no recorded val loss, the description's own init as the untrained twin -------------


def test_untrained_twin_is_functions_own_init_under_a_fixed_seed(user_dir):
    """The twin of FILE.py:FUNCTION with weights: FUNCTION() again under torch.manual_seed(TWIN_SEED), no weights
    loaded (its state dict is what a user gets by seeding and calling describe() by hand), recorded in provenance;
    the caller's random stream is untouched."""
    from depthlens.adapters.described import TWIN_SEED
    from depthlens.adapters.load import open_model, opened_of
    from depthlens.adapters.twin import described_twin as untrained_twin

    model = open_model(f"{user_dir / 'run' / 'model.safetensors'}@{user_dir / 'mymodel.py'}:describe").model
    rng = torch.get_rng_state()
    twin = untrained_twin(model)
    assert torch.equal(torch.get_rng_state(), rng)
    torch.manual_seed(TWIN_SEED)
    want = NS["describe"]().module.state_dict()
    got, trained = twin.module.state_dict(), model.module.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(got["lm_head.weight"], trained["lm_head.weight"])  # not the loaded weights
    assert opened_of(twin).provenance["untrained_init"] == f"the description's own init, torch seed {TWIN_SEED}"


def test_no_untrained_twin_is_refused_with_the_reason(user_dir, tmp_path, net):
    from safetensors.torch import save_file

    from depthlens.adapters.load import open_model
    from depthlens.adapters.twin import described_twin as untrained_twin

    with pytest.raises(DescriptionError, match="described in Python"):
        untrained_twin(_wrap(net))
    with pytest.raises(DescriptionError, match="without --weights"):
        untrained_twin(open_model(f"{user_dir / 'mymodel.py'}:describe").model)
    # FUNCTION wraps a module another (cached) module built: the twin would be the analysed model itself
    toy = (
        "from torch import nn\n\nNET = nn.ModuleDict(\n"
        "    dict(emb=nn.Embedding(11, 8), blocks=nn.ModuleList([nn.Linear(8, 8)]), out=nn.Linear(8, 11))\n)\n"
    )
    (tmp_path / "_dl_test_cached_net.py").write_text(toy)
    (tmp_path / "shared.py").write_text(
        "import depthlens\nfrom _dl_test_cached_net import NET\n\n\ndef describe():\n"
        "    return depthlens.wrap(NET, embed=NET.emb, blocks=NET.blocks, head=NET.out)\n"
    )
    ns: dict = {}
    exec(toy, ns)  # noqa: S102 (the test's own source)
    save_file(ns["NET"].state_dict(), str(tmp_path / "toy.safetensors"))
    model = open_model(f"{tmp_path / 'toy.safetensors'}@{tmp_path / 'shared.py'}:describe").model
    with pytest.raises(DescriptionError, match="returns a module it did not build"):
        untrained_twin(model)


def test_report_shows_no_val_loss_as_not_recorded_the_twin_and_skips_mixing_with_a_note(user_dir, tmp_path):
    """A described model beside a native one: its val loss is '—' (depthlens did not train it; never 'NaN'), its
    untrained columns are filled from the description's own init (untrained_init in summary.json and a note), and
    the depth-mixing matrix its description cannot give is skipped with a note, not written as NaN."""
    import json

    import xarray as xr

    native = _native_l4(tmp_path)
    out = tmp_path / "report"
    args = ["report", native, "mymodel.py:describe", "--weights", "run/model.safetensors", *EVAL[:4]]
    r = _cli([*args, "--metrics", "causal,mixing", "--n-boot", "0", "-o", out, "--quiet"], user_dir)
    assert r.exit_code == 0, r.output
    rows = {row["checkpoint"]: row for row in json.loads((out / "summary.json").read_text())}
    mine = rows["mymodel.py_describe"]
    assert mine["val_loss"] is None and mine["untrained_init"] == "the description's own init, torch seed 0"
    assert mine["causal_share_untrained"] is not None and mine["eval_loss_untrained"] is not None
    readme = (out / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| tiny_preln |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    head = next(line for line in readme.splitlines() if line.startswith("| design |"))
    col = [c.strip() for c in head.strip("|").split("|")].index("val loss (train.json)")
    assert cells[col] == "—" and "NaN" not in row
    assert "no train.json" in readme  # the footnote says why
    assert "mymodel.py_describe: mixing: not computed (" in readme and "`mixing` field" in readme
    assert "mymodel.py_describe: untrained baseline: the description's own init, torch seed 0" in readme
    assert "not recorded" in (out / "index.html").read_text()
    with xr.open_dataset(out / "mixing.nc") as ds:
        assert [str(c) for c in np.atleast_1d(ds.checkpoint.values)] == ["preln_l4"]
        assert np.isfinite(ds.depth_mixing.values).all()


def test_wrap_and_description_are_public_and_lazy():
    """`import depthlens as dl; dl.wrap(...)`, `dl.Description`: public names (in __all__), resolved on first use,
    so `import depthlens` (and `depthlens --help`) imports neither torch nor the described adapter."""
    import json
    import subprocess
    import sys

    # laziness needs a fresh interpreter (this one imported torch long ago); the names resolve the same here
    code = (
        "import json, sys\nimport depthlens as dl\n"
        "print(json.dumps([sorted(m for m in ('torch', 'depthlens.adapters.described') if m in sys.modules),\n"
        "                  sorted({'wrap', 'Description'} & set(dl.__all__))]))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == [[], ["Description", "wrap"]]
    import depthlens as dl
    from depthlens.adapters import described

    assert dl.wrap is described.wrap and dl.Description is described.Description


def test_a_report_runs_rank_and_attnres_on_what_the_description_gives(model):
    """In a study, `rank` and `attnres` apply to a described model by what its description gives (stream maps,
    AttnRes weights), not by its name (no registry design has it): they ran on no described model before. The
    table shows the value it computed (it showed NA by the design's name)."""
    from depthlens.render.pages import table_head, table_rows
    from depthlens.studies.study import Entry, applies

    def entry(m):
        return Entry("x", Path("x"), m, m.design.slug, m.n_layer, m.d_model, params={}, train={})

    hc, full = (_described_native(_native(a)) for a in ("hc", "full_attnres"))
    got = {k: [applies(k, entry(m)) for m in (model, hc, full)] for k in ("rank", "attnres", "mixing", "causal")}
    assert got == {
        "rank": [False, True, False],
        "attnres": [False, False, True],
        "mixing": [True, True, True],  # run everywhere: refused with a note where the description cannot give it
        "causal": [True, True, True],
    }
    rec = {"design": "described_hc", "n_layer": 4, "d_model": 32, "erank_full": 2.5, "erank_full_untrained": 3.0}
    assert dict(zip(table_head(), table_rows([rec])[0]))["erank (full); untrained"] == "2.50; 3.00"
    rec = {"design": "tiny_preln", "n_layer": 4, "d_model": 32}
    assert dict(zip(table_head(), table_rows([rec])[0]))["erank (full); untrained"] == "—"


def test_the_untrained_baseline_runs_only_where_the_trained_model_was_computed(model):
    """A diagnostic refused on the trained model (its note is in the report) is not run again on the untrained one
    (the note came twice); where it was computed, the baseline is attempted (here refused, with its reason: a
    model described in Python has no FILE.py:FUNCTION to rebuild)."""
    from depthlens.studies.study import Entry, StudyOptions, _compute_untrained

    data = EvalData.from_tokens(torch.zeros(1, 4, dtype=torch.long))
    e = Entry("x", Path("x"), model, model.design.slug, model.n_layer, model.d_model, params={}, train={})
    _compute_untrained(e, data, StudyOptions(metrics=("logit_lens",)))
    assert e.notes == []
    e.datasets["logit_lens"] = None  # computed (the value is not read here)
    _compute_untrained(e, data, StudyOptions(metrics=("logit_lens",)))
    assert e.notes == [
        "untrained baseline: not computed (no untrained twin for a model described in Python: "
        "depthlens rebuilds one only from FILE.py:FUNCTION)"
    ]


def test_prune_refuses_a_described_model_with_its_reason(user_dir):
    """prune writes the pruned model in its input's format; a described model is the user's code: one line that
    says so (it said 'no such checkpoint directory'), exit 1, nothing written."""
    args = ["prune", "mymodel.py:describe", "--weights", "run/model.safetensors", "--tolerance", "0.1"]
    r = _cli([*args, *EVAL, "-o", "pruned"], user_dir)
    lines = [l for l in r.output.splitlines() if l.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and "a described model is your own code" in lines[0], r.output
    assert not (user_dir / "pruned").exists()


def test_untrained_twin_keeps_the_modules_own_dtypes(tmp_path):
    """The twin is built as FUNCTION builds it, cast only if the model was opened in another dtype: a complex buffer
    (RoPE frequencies, as attn-res keeps them) stays complex (a cast to fp32 warned and dropped its phase)."""
    from safetensors.torch import save_file

    from depthlens.adapters.load import open_model
    from depthlens.adapters.twin import described_twin as untrained_twin

    src = (
        "import torch\nfrom torch import nn\nimport depthlens\n\n\n"
        "class Toy(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.emb, self.blocks, self.out = nn.Embedding(11, 8), nn.ModuleList([nn.Linear(8, 8)]), nn.Linear(8, 11)\n"
        "        self.register_buffer('freqs', torch.polar(torch.ones(4), torch.arange(4.0)), persistent=False)\n\n\n"
        "def describe():\n    toy = Toy()\n"
        "    return depthlens.wrap(toy, embed=toy.emb, blocks=toy.blocks, head=toy.out)\n"
    )
    (tmp_path / "cplx.py").write_text(src)
    ns: dict = {}
    exec(src, ns)  # noqa: S102 (the test's own source)
    save_file(ns["Toy"]().state_dict(), str(tmp_path / "w.safetensors"))
    twin = untrained_twin(open_model(f"{tmp_path / 'w.safetensors'}@{tmp_path / 'cplx.py'}:describe").model)
    assert twin.module.freqs.is_complex() and float(twin.module.freqs.imag.abs().max()) > 0.5

"""Models built and trained with other packages' code, analysed in place through their worked adapters
(examples/*.py `describe`, docs/own-model.md#worked-adapters), against two independent computations:

* the same weights loaded into depthlens's native design (tests/shared_weights.py), with the native options that
  match what a described skip does (HC/mHC `multistream_skip="mix"`, Full AttnRes `attnres_skip="zero_value"`) and
  `swap="all"` (a described block moves whole, its mixing with it);
* a plain forward-hook loop on the user's own model, written here: one forward per skipped layer, the updates read
  by hooks, the swapped models run by their own forward.

Each model is trained for a few steps with its package's code, saved as safetensors and loaded back, as a user would.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model

import depthlens
from depthlens.diagnostics.causal.engine import token_nll
from depthlens.runtime.evaldata import random_eval_data
from depthlens.stats.metrics import late_pairs
from helpers import FAST
from shared_weights import native_attnres, native_multistream

pytest.importorskip("hyper_connections")
pytest.importorskip("attn_res")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))  # the examples import their sibling tiny_llama, as a user's files next to each other
import attnres_model  # noqa: E402
import hc_model  # noqa: E402
import mhc_model  # noqa: E402
import nanogpt_model  # noqa: E402
from tiny_llama import train  # noqa: E402

V = 257  # the byte tokenizer's vocabulary: the CLI finds eval data for it
DATA = random_eval_data(V, n_seq=4, seq_len=16, seed=0, bos_id=0)
TOL = 1e-5
PACKAGES = ["hc", "mhc", "full_attnres", "block_attnres", "nanogpt"]


def build(kind: str, eps: float = 1e-6) -> torch.nn.Module:
    if kind == "hc":
        return hc_model.HCModel(vocab=V)
    if kind == "mhc":
        return mhc_model.MHCModel(vocab=V)
    if kind == "nanogpt":
        return nanogpt_model.GPT(vocab_size=V)
    return attnres_model.tiny("full" if kind == "full_attnres" else "block", eps=eps, vocab=V)


def describe(kind: str, model: torch.nn.Module):
    mod = {"hc": hc_model, "mhc": mhc_model, "nanogpt": nanogpt_model}.get(kind, attnres_model)
    return mod.describe(model)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """Each package's tiny model after 5 AdamW steps with its own forward, saved as safetensors."""
    out = {}
    for kind in PACKAGES:
        torch.manual_seed(0)
        model = build(kind)
        losses = train(model, V, steps=5, lr=1e-2)
        assert all(math.isfinite(x) for x in losses)
        out[kind] = tmp_path_factory.mktemp(kind) / "model.safetensors"
        save_model(model, str(out[kind]))
    return out


def load(kind: str, path: Path, eps: float = 1e-6) -> torch.nn.Module:
    torch.manual_seed(1)  # another init: the weights must come from the file
    model = build(kind, eps)
    load_model(model, str(path))
    return model.eval()


def maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape and (np.isnan(a) == np.isnan(b)).all()
    return float(np.nanmax(np.abs(a - b)))


# --- (a) against the native design on the same weights ------------------------------------------------------


def native_of(kind: str, model: torch.nn.Module):
    if kind in ("hc", "mhc"):
        return native_multistream(model)
    if kind.endswith("attnres"):
        return native_attnres(model)
    from transformers import GPT2Config, GPT2LMHeadModel

    from depthlens.adapters.hf import wrap

    t = model.transformer
    cfg = GPT2Config(
        vocab_size=V,
        n_positions=t.wpe.num_embeddings,
        n_embd=t.wte.embedding_dim,
        n_layer=len(t.h),
        n_head=t.h[0].attn.n_head,
        bos_token_id=0,
        eos_token_id=0,
        activation_function="gelu",  # nanoGPT's nn.GELU() is exact, GPT-2's default the tanh approximation
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf = GPT2LMHeadModel(cfg).eval()
    sd = {
        k: v.t() if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else v
        for k, v in model.state_dict().items()
    }
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.endswith(".attn.bias") or k.endswith("masked_bias") for k in missing), missing
    return wrap(hf)


@pytest.mark.parametrize("kind", PACKAGES)
@torch.no_grad()
def test_described_equals_native(kind, trained):
    # attn-res at a tiny eps: its output is the SUM of the sources, native's final operator (w = 0) their MEAN; the
    # two agree after the final RMSNorm only up to eps (the same trained weights, another eps)
    user = load(kind, trained[kind], eps=1e-12)
    native = native_of(kind, user)
    described = describe(kind, user)
    tok = DATA.tokens[:2]
    assert maxdiff(described(tok).numpy(), native(tok).numpy()) < TOL
    diffs = {}
    a, b = (depthlens.causal(m, DATA, progress=False) for m in (described, native))
    diffs["causal"] = maxdiff(a.causal_score.values, b.causal_score.values)
    assert float(np.nanmax(a.causal_score.values)) > 1e-3  # the skips do something
    a, b = (
        depthlens.permute(described, DATA, progress=False),
        depthlens.permute(native, DATA, swap="all", progress=False),
    )
    diffs["permute"] = maxdiff(a.perm_abs.values, b.perm_abs.values)
    a, b = (depthlens.angular(m, DATA, progress=False) for m in (described, native))
    diffs["angular"] = maxdiff(a.angular_distance.values, b.angular_distance.values)
    if kind in ("hc", "mhc"):
        a, b = (depthlens.rank(m, DATA, progress=False) for m in (described, native))
        diffs["erank"] = maxdiff(a.erank.values, b.erank.values)
        a, b = (depthlens.depth_mixing(m, DATA, progress=False) for m in (described, native))
        diffs["mixing"] = maxdiff(a.depth_mixing.values, b.depth_mixing.values)
    if kind.endswith("attnres"):
        a, b = (depthlens.attnres(m, DATA, progress=False) for m in (described, native))
        for v in ("self_weight", "self_weight_sublayer", "source_weight", "consumption", "mass_family"):
            diffs[v] = maxdiff(a[v].values, b[v].values)
        assert (a.dead_prefix.values == b.dead_prefix.values).all()
    print(kind, {k: f"{v:.1e}" for k, v in diffs.items()})  # the exactness numbers, shown with -s
    assert max(diffs.values()) < TOL, diffs


# --- (b) against a plain forward-hook loop on the user's own model --------------------------------------------


def _zero_after_bos(mods: list[torch.nn.Module]) -> list:
    """Forward hooks that zero each module's output (B, T, d) at positions 1.. (the `current` causal variant)."""

    def hook(m, args, out):
        out = out.clone()
        out[:, 1:] = 0
        return out

    return [m.register_forward_hook(hook) for m in mods]


def trace(kind: str, model: torch.nn.Module, tok: torch.Tensor, skip: int | None = None, maps: dict | None = None):
    """One forward of the user's model: views h_0..h_L (B, T, d), updates u_0..u_{L-1} (B, T, D), logits.

    Updates: one stream, h_{l+1} - h_l; HC/mHC, X_{l+1} - R_mlp R_attn X_l with the residual maps R
    re-derived here from the package's parameters; AttnRes (attn-res), the layer's two writes summed. `maps`, when
    given, receives the mixing objects: R per (layer, sublayer) for HC/mHC, the depth softmax (B, T, S) per
    sublayer for AttnRes.
    """
    hooks, rec = [], {"in": {}, "out": {}, "R": {} if maps is None else maps, "w": {}}
    put = lambda key, i: lambda m, args, out: rec[key].__setitem__(i, out)  # noqa: E731
    if kind.endswith("attnres"):
        subs = list(model.layers)
        hooks += [s.register_forward_hook(put("w", i)) for i, s in enumerate(subs)]
        for i, sub in enumerate(subs):  # alpha_i = softmax over sources of w . rms(v_i) (attn-res: no key gain)
            op = sub.attn_res
            softmax = lambda m, a, op=op, i=i: rec["R"].__setitem__(  # noqa: E731
                i,
                torch.einsum(
                    "d,nbtd->btn", op.pseudo_query, F.rms_norm(a[0], (a[0].shape[-1],), eps=op.key_norm.eps)
                ).softmax(-1),
            )
            hooks.append(op.register_forward_pre_hook(softmax))
        hooks.append(model.token_emb.register_forward_hook(put("in", 0)))
        if skip is not None:
            hooks += _zero_after_bos(subs[2 * skip : 2 * skip + 2])
    else:
        blocks = model.transformer.h if kind == "nanogpt" else model.blocks
        for l, b in enumerate(blocks):
            hooks.append(b.register_forward_pre_hook(lambda m, args, l=l: rec["in"].__setitem__(l, args[0])))
            hooks.append(b.register_forward_hook(put("out", l)))
            subs = [b.attn, b.mlp] if kind == "nanogpt" else [b.attn.branch, b.mlp.branch]
            if skip == l:
                hooks += _zero_after_bos(subs)
            if kind == "mhc":
                for i, sub in enumerate((b.attn, b.mlp)):
                    hooks.append(
                        sub.register_forward_pre_hook(lambda m, a, k=(l, i): rec["R"].__setitem__(k, m.maps(a[0])[2]))
                    )
            if kind == "hc":
                for i, hc in enumerate((b.attn, b.mlp)):

                    def ar(m, args, out, hc=hc, k=(l, i)):  # A_r = s tanh(norm(H) W_r) + A_r^0, as [dest, source]
                        a = torch.tanh(out[:, :, 0] @ hc.dynamic_alpha_fn) * hc.dynamic_alpha_scale + hc.static_alpha
                        rec["R"][k] = a[..., 1:].transpose(-1, -2)

                    hooks.append(hc.norm.register_forward_hook(ar))
    try:
        logits = model(tok)
    finally:
        for h in hooks:
            h.remove()
    L = len(rec["w"]) // 2 if kind.endswith("attnres") else len(rec["in"])
    if kind.endswith("attnres"):
        writes = [rec["w"][2 * l] + rec["w"][2 * l + 1] for l in range(L)]
        views = [rec["in"][0]]
        for w in writes:
            views.append(views[-1] + w)
        return views, writes, logits
    if kind == "hc":  # lucidrains' ((B n), T, d) -> (B, T, n, d)
        unfold = lambda x: x.view(x.shape[0] // 4, 4, *x.shape[1:]).transpose(1, 2)  # noqa: E731
        rec["in"] = {l: unfold(x) for l, x in rec["in"].items()}
        rec["out"] = {l: unfold(x) for l, x in rec["out"].items()}
    states = [rec["in"][l] for l in range(L)] + [rec["out"][L - 1]]
    if kind == "nanogpt":
        return states, [states[l + 1] - states[l] for l in range(L)], logits
    ups = [states[l + 1] - rec["R"][(l, 1)] @ (rec["R"][(l, 0)] @ states[l]) for l in range(L)]
    return [x.sum(2) for x in states], [u.flatten(2) for u in ups], logits


def hook_causal(kind: str, model, tok) -> np.ndarray:
    """C(s, t), max over positions 1.. of |u_t' - u_t| / max(|u_t|, eps) (bench/diagnostics._causal_reduce)."""
    _, clean, _ = trace(kind, model, tok)
    L = len(clean)
    C = np.zeros((L, L))  # t < s: a skip cannot change an earlier update
    for s in range(L):
        _, new, _ = trace(kind, model, tok, skip=s)
        for t in range(s, L):
            r = (new[t] - clean[t]).norm(dim=-1) / clean[t].norm(dim=-1).clamp_min(1e-6)
            C[s, t] = float(r[:, 1:].max())
    return C


def hook_angular(kind: str, model, tok) -> np.ndarray:
    """D_n(l) at the last position: arccos(cos(h_l, h_{l+n})) / pi, mean over sequences."""
    views, _, _ = trace(kind, model, tok)
    L = len(views) - 1
    D = np.full((L + 1, L + 1), np.nan)
    for l in range(L + 1):
        for n in range(L + 1 - l):
            c = F.cosine_similarity(views[l][:, -1].double(), views[l + n][:, -1].double(), dim=-1)
            D[l, n] = float((torch.arccos(c.clamp(-1, 1)) / math.pi).mean())
    return D


def swapped(kind: str, model, i: int, j: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The user's model with layers i and j exchanged in its own forward (attn-res: both sublayers of each)."""

    def run(tok):
        seq = model.layers if kind.endswith("attnres") else model.transformer.h if kind == "nanogpt" else model.blocks
        idx = [(2 * i, 2 * j), (2 * i + 1, 2 * j + 1)] if kind.endswith("attnres") else [(i, j)]
        for a, b in idx:
            seq[a], seq[b] = seq[b], seq[a]
        try:
            return model(tok)
        finally:
            for a, b in idx:
                seq[a], seq[b] = seq[b], seq[a]

    return run


def hook_erank(kind: str, model, tok) -> float:
    """Token mean (positions 1..) of the effective rank exp H(σ / Σσ) of the full product R_{2L-1} ... R_0 (NumPy)."""
    maps: dict = {}
    trace(kind, model, tok, maps=maps)
    P = None
    for key in sorted(maps):
        R = maps[key].double().numpy()
        P = R if P is None else R @ P  # the later map on the left
    sv = np.linalg.svd(P[:, 1:], compute_uv=False)
    p = sv / sv.sum(-1, keepdims=True)
    return float(np.exp(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)).mean())


def hook_self_weight(kind: str, model, tok) -> np.ndarray:
    """Per layer: the token mean (positions 1..) of the weight each sublayer puts on its own block's partial sum
    (Full: on the previous sublayer), averaged over the layer's two sublayers where defined (NaN at the first
    sublayer and at a block's first sublayer, whose last source is a finished block)."""
    maps: dict = {}
    trace(kind, model, tok, maps=maps)
    bs = 1 if kind == "full_attnres" else model.cfg.block_size
    own = [
        maps[j][..., -1] if (j > 0 and (bs == 1 or j % bs)) else torch.full_like(maps[j][..., 0], torch.nan)
        for j in sorted(maps)
    ]
    per_layer = torch.stack(own).double().view(len(own) // 2, 2, *own[0].shape).nanmean(1)  # (L, B, T)
    return per_layer[:, :, 1:].flatten(1).nanmean(1).numpy()


@pytest.mark.parametrize("kind", PACKAGES)
@torch.no_grad()
def test_described_equals_hook_loop(kind, trained):
    tok = DATA.tokens
    user = load(kind, trained[kind])  # run by its own forward
    described = describe(kind, load(kind, trained[kind]))
    diffs = {}
    a = depthlens.causal(described, DATA, progress=False).causal_score.sel(variant="current", aggregator="max").values
    later = np.triu_indices(a.shape[0], 1)  # t > s (the diagonal and below are conventions, not measurements)
    diffs["causal"] = maxdiff(a[later], hook_causal(kind, user, tok)[later])
    a = depthlens.angular(described, DATA, progress=False).angular_distance.values
    diffs["angular"] = maxdiff(a, hook_angular(kind, user, tok))
    P = depthlens.permute(described, DATA, progress=False).perm_abs.values
    base = token_nll(user(tok), tok).mean()
    L = P.shape[0]
    for i, j in late_pairs(L):
        ref = float(token_nll(swapped(kind, user, int(i), int(j))(tok), tok).mean() - base)
        diffs[f"permute {i},{j}"] = abs(P[i, j] - ref)
    if kind in ("hc", "mhc"):
        ds = depthlens.rank(described, DATA, progress=False)
        diffs["erank"] = abs(float(ds.erank.sel(product="full", statistic="mean")) - hook_erank(kind, user, tok))
    if kind.endswith("attnres"):
        a = depthlens.attnres(described, DATA, progress=False).self_weight.values
        diffs["self_weight"] = maxdiff(a, hook_self_weight(kind, user, tok))
    print(kind, {k: f"{v:.1e}" for k, v in diffs.items()})  # the exactness numbers, shown with -s
    assert max(diffs.values()) < TOL, diffs


# --- from the command line: FILE.py:FUNCTION --weights W, as the docs show it ---------------------------------

FUNCTION = {
    "hc": "hc_model.py:describe",
    "mhc": "mhc_model.py:describe",
    "full_attnres": "attnres_model.py:describe",
    "block_attnres": "attnres_model.py:describe_block",
    "nanogpt": "nanogpt_model.py:describe",
}
EVAL = [*FAST, "--threads", "1"]
CLI_VARS = {"causal": "causal_score", "permute": "perm_abs", "angular": "angular_distance", "rank": "erank"}
CLI_VARS["attnres"] = "self_weight"


def _cli(args: list) -> object:
    from typer.testing import CliRunner

    from depthlens.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _commands(kind: str) -> list[str]:
    extra = ["rank"] if kind in ("hc", "mhc") else ["attnres"] if kind.endswith("attnres") else []
    return ["causal", "permute", "angular", *extra]


@pytest.mark.parametrize("kind", PACKAGES)
@torch.no_grad()
def test_cli_runs_each_worked_adapter_as_the_api_does(kind, trained, tmp_path):
    """`depthlens COMMAND examples/FILE.py:FUNCTION --weights W`: the trained weights (saved by the package's own
    model) load into the adapter's model, and every command gives what the API gives on that model in Python."""
    import xarray as xr

    from depthlens.runtime.evaldata import EvalData
    from depthlens.studies import api

    described = describe(kind, load(kind, trained[kind]))
    for command in _commands(kind):
        out = tmp_path / f"{command}.nc"
        r = _cli([command, EXAMPLES / FUNCTION[kind], "--weights", trained[kind], *EVAL, "-o", out])
        assert r.exit_code == 0, r.output
        var = CLI_VARS[command]
        with xr.open_dataset(out) as ds:
            got, tokens = ds[var].values, ds.eval_tokens.values
            assert ds.attrs["described_function"] == FUNCTION[kind].split(":")[1]
        fn = {"causal": api.causal, "permute": api.permute, "angular": api.angular, "rank": api.rank}
        fn["attnres"] = api.attnres
        want = fn[command](described, EvalData.from_tokens(tokens, bos=True), progress=False)[var].values
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.slow
def test_report_puts_the_worked_adapters_in_one_table(trained, tmp_path):
    """`depthlens report` (a subprocess, as a user runs it) on all five models trained with their packages, and the
    same report from the Python API."""
    import json
    import subprocess

    args = []
    for kind in PACKAGES:
        args += [EXAMPLES / FUNCTION[kind], "--weights", trained[kind]]
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "depthlens.cli", "report", *args, *EVAL[:4], "--n-boot", "0", "-o", out, "--quiet"]
    cmd += ["--metrics", "causal,permutation,angular"]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rows = json.loads((out / "summary.json").read_text())
    names = {row["checkpoint"] for row in rows}
    assert names == {f.replace(":", "_") for f in FUNCTION.values()}
    # the Python API's report on the same models (WEIGHTS@FILE.py:FUNCTION) gives the same table
    from depthlens.studies import api

    refs = [f"{trained[k]}@{EXAMPLES / FUNCTION[k]}" for k in PACKAGES]
    api.report(
        refs, tmp_path / "api", metrics="causal,permutation,angular", n_seq=2, seq_len=16, n_boot=0, progress=False
    )
    by_name = {row["checkpoint"]: row for row in json.loads((tmp_path / "api" / "summary.json").read_text())}
    for row in rows:
        other = by_name[row["checkpoint"]]
        assert (row["design"], row["n_layer"]) == (other["design"], other["n_layer"])
        for key in ("eval_loss", "causal_share", "perm_share", "causal_theta_50"):
            assert row[key] == pytest.approx(other[key], abs=1e-6), (row["checkpoint"], key)


# --- the adapters as the docs show them ------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "own-model.md"
ADAPTER_FILES = ["hc_model.py", "mhc_model.py", "attnres_model.py", "nanogpt_model.py"]


def code_lines(src: str) -> int:
    """Lines of code: not blank, not a comment, not part of a docstring."""
    import ast

    doc: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        first = (
            getattr(node, "body", [None])[0] if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) else None
        )
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            doc.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for i, line in enumerate(src.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and i not in doc
    )


def test_code_lines_counts_code_only():
    src = 'def f(x):\n    """Doc\n    string."""\n    # a comment\n\n    return (x +\n            1)\n'
    assert code_lines(src) == 3


@pytest.mark.parametrize("file", ADAPTER_FILES)
def test_each_adapter_is_at_most_30_lines(file):
    """The adapter: from the file's `# --- the adapter` line to its `__main__` part (the model above is the user's)."""
    s = (EXAMPLES / file).read_text()
    adapter = s[s.index("# --- the adapter") : s.index("\n# python examples/")]
    assert 5 < code_lines(adapter) <= 30


def test_docs_show_the_adapters_the_tests_run():
    """Every function a docs/own-model.md block defines next to `from X_model import` is the examples' own, verbatim."""
    import ast
    import re

    text = DOC.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    seen = set()
    for code in blocks:
        m = re.search(r"^from (\w+_model) import", code, re.M)
        if m is None:
            continue
        ours = {n.name: n for n in ast.parse((EXAMPLES / f"{m.group(1)}.py").read_text()).body if hasattr(n, "name")}
        for node in ast.parse(code).body:
            if isinstance(node, ast.FunctionDef):
                assert ast.dump(node) == ast.dump(ours[node.name]), f"{m.group(1)}.{node.name} differs from the docs"
                seen.add(f"{m.group(1)}.{node.name}")
    assert {f"{f[:-3]}.describe" for f in ADAPTER_FILES} | {"attnres_model.describe_block"} <= seen


def test_docs_speed_ratio_is_the_committed_bench():
    import json

    bench = json.loads((Path(__file__).resolve().parents[1] / "reports" / "bench" / "own_model.json").read_text())
    ratio = bench["ratio_described_over_native"]
    assert f"the description costs {ratio:.2f}× the native run" in DOC.read_text()

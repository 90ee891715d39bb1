"""bf16 end to end: every diagnostic runs in bf16 close to fp32, and every reduction accumulates in fp32/fp64.

What bf16 may change is the forward itself (weights and activations rounded to 8 mantissa bits, ~0.4% per op),
so bf16 results are compared to fp32 ones within a stated tolerance. What it must never change is how the
engines reduce: norms, sums of squares, softmax/logsumexp/NLL, angles and SVDs run in float32 or float64.
Those are checked on constructed cases where bf16 accumulation would be visibly wrong, against float64
references computed here from the same bf16 inputs.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from depthlens.diagnostics import registry
from depthlens.runtime.evaldata import random_eval_data
from depthlens.stats import metrics as M
from helpers import debug_model

REPO = Path(__file__).resolve().parents[1]
DATA = random_eval_data(97, n_seq=4, seq_len=24, seed=1, bos_id=96)


def perturbed(arch: str):
    """A debug model whose routers and weights are far from their (trivially uniform) init, so bf16 rounding
    has something to change: every parameter + N(0, 0.3²)."""
    m = debug_model(arch, n_layer=4, seed=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


# (diagnostic, design, engine options, variable, atol, rtol): the bf16 tolerance |bf16 − fp32| <= atol + rtol·|fp32|.
# Scales: angular distance and self-weights live in [0, 1]; losses of these models are ~6 nats, so 0.03 nats is
# 0.5% of the loss (bf16's 2^-8 ≈ 0.4% per rounding, through 4 layers); erank lives in [1, 4].
CASES = [
    ("angular", "preln", {}, "angular_distance", 0.01, 0.0),
    ("causal", "preln", {"variants": ("current",)}, "causal_score", 0.02, 0.05),
    ("causal", "preln", {"variants": ("current",), "outputs": True}, "skip_delta_loss", 0.03, 0.0),
    ("permutation", "preln", {"pairs": "all"}, "perm_abs", 0.03, 0.0),
    ("permutation", "preln", {"pairs": "all"}, "clean_loss", 0.0, 2e-3),
    ("rank", "mhc", {}, "erank", 0.05, 0.0),
    ("attnres", "full_attnres", {}, "self_weight", 0.01, 0.0),
    ("mixing", "hc", {}, "depth_mixing", 0.01, 0.02),
]


@pytest.mark.parametrize("name,arch,opts,var,atol,rtol", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_bf16_model_gives_finite_results_close_to_fp32(name, arch, opts, var, atol, rtol):
    m = perturbed(arch)
    ref = registry.run(name, m, DATA, **opts)
    got = registry.run(name, m.to(torch.bfloat16), DATA, **opts)
    x, y = ref[var].values, got[var].values
    assert np.array_equal(np.isfinite(x), np.isfinite(y))  # same cells defined, nothing overflowed to inf/NaN
    ok = np.isfinite(x)
    assert ok.any()
    np.testing.assert_allclose(y[ok], x[ok], atol=atol, rtol=rtol)
    assert np.abs(y[ok] - x[ok]).max() > 0  # the model really ran in bf16 (else this test proves nothing)
    for k, v in got.data_vars.items():  # bf16 never leaks into a result: netCDF and numpy have no bf16
        if v.dtype.kind == "f":
            assert v.dtype in (np.float32, np.float64), (k, v.dtype)
    assert got.attrs["dtype"] == "bfloat16"  # provenance says what ran


def test_bf16_teacher_forced_nll_close_to_fp32():
    from depthlens.data.tokenizers import ByteTokenizer
    from depthlens.diagnostics.nll import Item, teacher_forced_nll

    m = perturbed("preln")

    class Tok:  # byte ids folded into the debug vocabulary of 97
        bos_id = 96

        def encode(self, s):
            return [b % 96 for b in ByteTokenizer().encode(s)]

    items = [Item("def add(a, b):", " return a + b"), Item("x = ", "42")]
    ref = teacher_forced_nll(m, Tok(), items)
    got = teacher_forced_nll(m.to(torch.bfloat16), Tok(), items)
    assert math.isfinite(got["nll"]) and abs(got["nll"] - ref["nll"]) < 0.03
    assert got["nll"] != ref["nll"]


# --- the accumulators: constructed cases where a bf16 reduction would be visibly wrong -------------------------


def test_sum_of_many_small_squared_norms_accumulates_in_float64():
    """Pooled ratio over 200k tokens of small updates: a bf16 running sum stops growing once it is 2^8 times
    the addend (it would stall near 256·x and the ratio would be off by O(1))."""
    g = torch.Generator().manual_seed(0)
    old = (0.01 * torch.randn(200_000, 8, generator=g)).bfloat16()
    new = (old.float() + 0.003 * torch.randn(200_000, 8, generator=g)).bfloat16()
    got = M.pooled_relative_change(new, old)
    o, n = old.double(), new.double()
    want = ((n - o).square().sum() / o.square().sum()).sqrt()
    assert got.dtype == torch.float64 and got.item() == pytest.approx(want.item(), rel=1e-12)
    naive = (
        ((n - o).square().bfloat16().sum(dtype=torch.bfloat16)) / o.square().bfloat16().sum(dtype=torch.bfloat16)
    ).sqrt()
    assert abs(naive.double().item() - want.item()) > 1e-3 * want.item()  # the case does separate the two


def test_residual_norm_over_a_wide_model_is_float32():
    """‖h‖² per token over d = 8192 (a 70B-wide residual) from bf16 states: float32, within 1e-6 of float64."""
    from depthlens.diagnostics.causal.engine import residual_sq

    h = torch.randn(2, 3, 8192, generator=torch.Generator().manual_seed(1)).bfloat16()
    m = debug_model("preln")
    got = residual_sq(m, {"h": h})
    want = h.double().square().sum(-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


def test_long_vocabulary_softmax_and_nll_are_float32():
    """NLL over a 50,257-token vocabulary from bf16 logits: causal's fused softmax and loss_log_probs (which the
    permutation score reads) match float64 log-softmax of the same logits to 1e-5 nats."""
    from depthlens.diagnostics.causal.engine import _probs_nll

    g = torch.Generator().manual_seed(2)
    V, T = 50_257, 6
    logits = (3 * torch.randn(2, T, V, generator=g)).bfloat16()
    toks = torch.randint(0, V, (2, T), generator=g)
    ref = torch.log_softmax(logits.double(), -1)[:, 1:-1]  # loss positions 1..T-2
    want = -ref.gather(-1, toks[:, 2:, None]).squeeze(-1)
    lp = M.loss_log_probs(logits)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp.double(), ref, atol=1e-5, rtol=0)
    p, nll = _probs_nll(logits.clone(), toks)
    assert p.dtype == nll.dtype == torch.float32
    torch.testing.assert_close(nll.double(), want, atol=1e-5, rtol=0)
    z0 = M.loss_logits(logits)
    assert z0.dtype == torch.float32
    torch.testing.assert_close(
        (z0.logsumexp(-1) - z0.gather(-1, toks[:, 2:, None])[..., 0]).double(), want, atol=1e-5, rtol=0
    )
    naive = -(torch.log_softmax(logits, -1)[:, 1:-1]).gather(-1, toks[:, 2:, None]).squeeze(-1)
    assert (naive.double() - want).abs().max() > 1e-3  # a bf16 softmax would be visibly off


def test_small_angles_and_svd_from_bf16_inputs():
    """Angular distance between nearby bf16 states and erank of bf16 maps: float32/float64 math on the bf16
    values, equal to float64 references (a bf16 norm of x̂ − ŷ would round small angles to 0)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(500, 256, generator=g).bfloat16()
    y = (x.float() + 0.02 * torch.randn(500, 256, generator=g)).bfloat16()
    d = M.angular_distance(x, y)
    xd, yd = x.double(), y.double()
    cos = (xd * yd).sum(-1) / (xd.norm(dim=-1) * yd.norm(dim=-1))
    want = torch.arccos(cos.clamp(-1, 1)) / math.pi
    assert d.dtype == torch.float32
    torch.testing.assert_close(d.double(), want, atol=1e-6, rtol=1e-4)
    A = torch.randn(64, 4, 4, generator=g).bfloat16()
    er = M.effective_rank(A)
    sv = np.linalg.svd(A.double().numpy(), compute_uv=False)
    p = sv / sv.sum(-1, keepdims=True)
    assert er.dtype == torch.float64
    np.testing.assert_allclose(er.numpy(), np.exp(-(p * np.log(p)).sum(-1)), rtol=1e-12)


# --- the CLI and API dtype paths ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt("preln")


def test_cli_dtype_bf16_runs_end_to_end(ckpt, tmp_path):
    from depthlens.cli import app

    heads = {}
    for dt in ("fp32", "bf16"):
        out = tmp_path / f"{dt}.nc"
        r = CliRunner().invoke(
            app,
            [
                "permute",
                str(ckpt),
                "--dtype",
                dt,
                "--json",
                "--out",
                str(out),
                "--n-boot",
                "0",
                "--n-seq",
                "2",
                "--seq-len",
                "16",
            ],
        )
        assert r.exit_code == 0, r.output
        heads[dt] = json.loads(r.stdout)
        import xarray as xr

        with xr.open_dataset(out) as ds:
            assert ds.attrs["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[dt]
            assert ds["perm_abs"].dtype == np.float64
    assert heads["bf16"]["clean_loss"] == pytest.approx(heads["fp32"]["clean_loss"], rel=2e-3)
    assert heads["bf16"]["clean_loss"] != heads["fp32"]["clean_loss"]


def test_api_dtype_reaches_the_model_and_an_in_memory_model_is_not_silently_kept(ckpt):
    import depthlens.studies.api as dl
    from depthlens.errors import DepthlensError

    ds = dl.angular(ckpt, DATA_257, dtype=torch.bfloat16)
    assert ds.attrs["dtype"] == "bfloat16" and ds["angular_distance"].dtype == np.float64
    m = debug_model("preln")
    with pytest.raises(DepthlensError, match="dtype"):
        dl.angular(m, DATA, dtype=torch.bfloat16)  # would silently analyse the fp32 model
    assert dl.angular(m.to(torch.bfloat16), DATA, dtype=torch.bfloat16).attrs["dtype"] == "bfloat16"


DATA_257 = random_eval_data(257, n_seq=2, seq_len=16, seed=0, bos_id=256)


# --- device placement: a static scan ------------------------------------------------------------------------

FACTORIES = {"arange", "zeros", "ones", "full", "empty", "tensor", "eye", "rand", "randn", "randint", "linspace"}
# Functions allowed to build tensors without device=, each with the reason they never meet a model tensor
# on another device. A new unplaced factory call elsewhere fails this test until it gets a device= or a
# line here saying why it does not need one.
HOST_ONLY = {
    ("stats/metrics.py", "_angular_sums"): "float64 sums on the host (results are .cpu()'d into it)",
    ("stats/metrics.py", "__init__"): "AngularAccumulator's float64 host sum",
    (
        "diagnostics/causal/arms.py",
        "make_arms",
    ): "arm masks live on the host; the engine moves each slice to the state's device",
    ("runtime/evaldata.py", "random_eval_data"): "eval tokens live on the host; engines move batches to the model",
    (
        "diagnostics/lens/engine.py",
        "__init__",
    ): "the tuned lens' translators are built on the host, then moved with .to(the model's device)",
    (
        "diagnostics/lens/engine.py",
        "train_translators",
    ): "sample indices into the host-side activation store; each batch is moved",
}


def _unplaced_factory_calls(path: Path):
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)
            ):
                yield fn.name, node.lineno, node.func.attr


def test_no_unplaced_tensor_factories_in_the_engines_and_adapters():
    engines = [
        p
        for d in ("analysis", "diagnostics", "stats", "runtime")
        for p in sorted((REPO / "depthlens" / d).rglob("*.py"))
    ]
    assert (
        REPO / "depthlens/diagnostics/causal/engine.py" in engines
    )  # the scan still sees the engines (wherever they live)
    files = [
        *engines,
        REPO / "depthlens/adapters/hf.py",
        REPO / "depthlens/adapters/generic.py",
        REPO / "depthlens/adapters/placement.py",
    ]
    bad = [
        (rel, fn, line, what)
        for f in files
        if f.exists()
        for rel in [f.relative_to(REPO / "depthlens").as_posix()]
        for fn, line, what in _unplaced_factory_calls(f)
        if (rel, fn) not in HOST_ONLY
    ]
    assert not bad, f"torch factories without device= (add device=, or a HOST_ONLY reason): {bad}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        "import torch\ndef f(h):\n    return h + torch.arange(3)\n"
        "def g(h):\n    return h + torch.arange(3, device=h.device)\n"
    )
    assert list(_unplaced_factory_calls(src)) == [("f", 3, "arange")]


def test_report_and_track_take_dtype(ckpt):
    """render/track --dtype: the models are loaded in it, and track's study runs in it (the result cache's key
    holds the dtype: tests/test_result_cache.py); an unknown name is a usage error."""
    from depthlens.cli import app
    from depthlens.studies import track as TR
    from depthlens.studies.report import ReportOptions, load_entries

    (e,) = load_entries([ckpt], dtype="bf16")
    assert next(e.model.parameters()).dtype == torch.bfloat16
    assert ReportOptions(dtype="bf16").as_dict()["dtype"] == "bf16"
    assert TR.TrackOptions(dtype="bf16").study().dtype == "bf16"
    for cmd in (["report", str(ckpt), "--out", "r"], ["track", str(ckpt)], ["angular", str(ckpt)]):
        r = CliRunner().invoke(app, [*cmd, "--dtype", "fp8"])
        assert r.exit_code == 2 and "--dtype must be one of" in r.stderr, (cmd, r.output)

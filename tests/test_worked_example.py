"""docs/architecture.md's worked example, run as it is written: its module (one new file) and its registry entry
give, with no other edit, a CLI command, an API function, a report column with intervals and an untrained
baseline, a sweep, a figure and a track series, on a native checkpoint and on a Hugging Face model.

It runs twice: as a plug-in (the package on sys.path under another name, its spec `register`ed for the test), and in
the package tree of a copied checkout (`test_the_example_inside_the_package_passes_ci_and_these_tests`: the blocks
at depthlens/diagnostics/update_align/engine.py and __init__.py, the package one more name in PACKAGES), where this
file runs again with IN_TREE set, after ruff, the format check, mypy, the architecture and the registry tests.

The numbers are checked against an independent computation: the layer updates read from TransformerLens hook
points (native) or PyTorch forward hooks on the HF decoder layers, and the late-window share recounted in NumPy.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import depthlens
from depthlens.diagnostics import registry
from depthlens.diagnostics.registry import Diagnostic
from depthlens.models import ModelConfig, build_model
from helpers import FAST_INTERVALS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
IN_TREE = os.environ.get("DEPTHLENS_WORKED_EXAMPLE_IN_TREE") == "1"  # set by the package-tree run below
# the doc's package: in the package tree (the copied checkout) or written to a temp dir under a plug-in's name
MODULE = "depthlens.diagnostics.update_align" if IN_TREE else "depthlens_worked_example_update_align"
TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune.\ndef add(a, b):\n    return a + b\n\n"
) * 8
EVAL = FAST_INTERVALS


def doc_blocks() -> tuple[str, str]:
    """The worked example's two Python blocks: the engine module and the spec (the package's __init__.py)."""
    section = DOC.read_text(encoding="utf-8").split("## How to add a diagnostic (worked example)", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 2, "the worked example lost a code block"
    return blocks[0], blocks[1]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Diagnostic:
    """The doc's package on sys.path under a plug-in's name, and its spec; in the package tree, the shipped
    registry's entry."""
    if IN_TREE:
        yield registry.get("update_align")
        return
    engine_src, spec_src = doc_blocks()
    d = tmp_path_factory.mktemp("plugin")
    (d / MODULE).mkdir()
    (d / MODULE / "engine.py").write_text(engine_src, encoding="utf-8")
    (d / MODULE / "__init__.py").write_text(spec_src, encoding="utf-8")
    sys.path.insert(0, str(d))
    importlib.invalidate_caches()
    (entry,) = importlib.import_module(MODULE).SPECS
    yield entry
    sys.path.remove(str(d))
    for name in [m for m in sys.modules if m == MODULE or m.startswith(MODULE + ".")]:
        sys.modules.pop(name)


@pytest.fixture
def registered(example):
    torch.set_num_threads(1)
    if IN_TREE:
        assert example in registry.DIAGNOSTICS  # the package's own entry, no `register` call
        yield example
        return
    with registry.register(example):
        yield example
    assert "update_align" not in registry.names()  # the shipped registry is left as it was


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, list[Path]]:
    """Two native Pre-LN checkpoints (a series: step_1, step_2) and a DeepNorm one, L = 4 (single-stream, so u_l =
    h_l+1 - h_l is also the difference of the hook points), and two random tiny LLaMAs saved as HF directories.
    The Pre-LN pair records a training seed (train.json), so a report can build their untrained twins."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("models")
    native = [
        depthlens.save(
            build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32), seed=k),
            root / "native" / f"step_{k + 1}",
        )
        for k in range(2)
    ]
    for path in native:  # a training seed whose step-0 weights differ from these: the report's untrained twin
        (path / "train.json").write_text(json.dumps({"seed": 100 + native.index(path)}), encoding="utf-8")
    deepnorm = depthlens.save(
        build_model(ModelConfig.debug("deepnorm", vocab_size=257, max_seq_len=32), seed=2), root / "deepnorm"
    )
    hf = []
    for k in range(2):
        torch.manual_seed(k)
        cfg = LlamaConfig(
            vocab_size=257,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
        path = root / "hf" / f"step_{k + 1}"
        LlamaForCausalLM(cfg).eval().save_pretrained(str(path), safe_serialization=True)
        hf.append(path)
    (root / "eval.txt").write_text(TEXT, encoding="utf-8")
    return {"native": native, "hf": hf, "deepnorm": [deepnorm], "eval": [root / "eval.txt"]}


# --- the independent computation -----------------------------------------------------------------------------


def native_updates(path: Path, tokens: torch.Tensor) -> np.ndarray:
    """u_l = resid_post - resid_pre of every block, from TransformerLens hook points: (L, B, T, d)."""
    model = depthlens.load(path).model.eval()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    L = model.n_layer
    return np.stack(
        [
            (cache[f"blocks.{l}.hook_resid_post"] - cache[f"blocks.{l}.hook_resid_pre"]).double().numpy()
            for l in range(L)
        ]
    )


def hf_updates(path: Path, tokens: torch.Tensor) -> np.ndarray:
    """u_l = output of decoder layer l minus its input, from forward hooks on the HF modules: (L, B, T, d)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path)).eval()
    outs: list[torch.Tensor] = []
    hooks = [model.model.embed_tokens.register_forward_hook(lambda m, i, o: outs.append(o))]
    for layer in model.model.layers:
        hooks.append(layer.register_forward_hook(lambda m, i, o: outs.append(o[0] if isinstance(o, tuple) else o)))
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    h = [o.double().numpy() for o in outs]  # embedding, then after each layer
    return np.stack([h[l + 1] - h[l] for l in range(len(h) - 1)])


def alignment(u: np.ndarray) -> np.ndarray:
    """A(i, j) per sequence from updates (L, B, T, D): |cos| per token, mean over positions 1..T-1: (L, L, B)."""
    unit = u / np.linalg.norm(u, axis=-1, keepdims=True)
    return np.abs(np.einsum("ibtd,jbtd->ijbt", unit, unit))[..., 1:].mean(-1)


def late_share(A: np.ndarray, theta: float) -> float:
    """Share of pairs i < j in the late window ⌊L/4⌋..L-1 with A > θ, counted by hand."""
    L = A.shape[0]
    a = L // 4
    pairs = [(i, j) for i in range(a, L) for j in range(i + 1, L)]
    return sum(A[i, j] > theta for i, j in pairs) / len(pairs)


UPDATES = {"native": native_updates, "hf": hf_updates}


# --- the test ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_api_function_matches_an_independent_computation(registered, models, kind):
    from depthlens.studies import api

    tokens = torch.randint(1, 257, (3, 12), generator=torch.Generator().manual_seed(0))
    for path in models[kind] + (models["deepnorm"] if kind == "native" else []):
        ds = api.update_align(path, tokens)  # the API function the registry entry gives
        assert ds.equals(api.run("update_align", path, tokens))
        want = alignment(UPDATES[kind](path, tokens))
        np.testing.assert_allclose(ds["update_align_seq"].values, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ds["update_align"].values, want.mean(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_cli_command(registered, models, kind, tmp_path):
    from depthlens.cli import app

    runner = CliRunner()
    assert "update_align" in runner.invoke(app, ["--help"]).output
    out = tmp_path / "a.nc"
    r = runner.invoke(
        app,
        [
            "update_align",
            str(models[kind][0]),
            "--data",
            str(models["eval"][0]),
            *EVAL,
            "--n-boot",
            "50",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    head = json.loads(r.output)["update_align"]
    ds = xr.load_dataset(out)
    assert head["share"] == pytest.approx(late_share(ds["update_align"].values, 0.5))
    assert 0.0 <= head["ci_low"] <= head["ci_high"] <= 1.0
    r = runner.invoke(app, ["update_align", str(models[kind][0]), "--opt", "nope"])
    assert r.exit_code == 2 and "key=value" in r.output


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_report_column_with_intervals_sweep_and_figure(registered, models, kind, tmp_path):
    from depthlens.studies.report import ReportOptions, build_report

    out = tmp_path / "rep"
    opts = ReportOptions(data=models["eval"][0], n_seq=4, seq_len=16, n_boot=50, metrics=("update_align",))
    rep = build_report(models[kind], out, opts)
    rows = json.loads((out / "summary.json").read_text())
    ds = xr.load_dataset(out / "update_align.nc")
    for row in rows:
        A = ds["update_align"].sel(checkpoint=row["checkpoint"]).values
        assert row["update_align_share"] == pytest.approx(late_share(A, 0.5))
        assert row["update_align_ci_low"] <= row["update_align_ci_high"]
        assert row["update_align_shard_sd"] is None  # 4 sequences: fewer than 5 shards
        assert "update_align_theta_50" in row
        assert (out / "figures" / f"{row['checkpoint']}_update_align.png").is_file()
    for row in rows:  # the untrained twin's share, and trained - untrained with its paired interval
        if kind == "hf":  # a foreign model records no training seed: no twin, and the report says so
            assert row["update_align_share_untrained"] is None
            continue
        assert row["update_align_share_untrained"] is not None
        d, lo, hi = (row[f"update_align_untrained_diff{k}"] for k in ("", "_low", "_high"))
        assert d == pytest.approx(row["update_align_share"] - row["update_align_share_untrained"])
        assert lo <= d <= hi
    readme = (out / "README.md").read_text()
    assert "share A > 0.5 [95% CI]" in readme
    sw = xr.load_dataset(out / "sweep_update_align.nc")
    assert sw["share"].sizes["threshold"] == 21  # 0, 0.05, ..., 1.0 (the headline 0.5 is on it)
    assert rep.robustness and rep.robustness[0]["metric"] == "update_align"
    assert "sweep_update_align" in rep.figures and "overview_update_align" in rep.figures


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_track_series(registered, models, kind, tmp_path):
    from depthlens.studies import track as T

    series = T.scan(models[kind])
    opts = T.TrackOptions(
        metrics=T.parse_metrics("update_align"), data=str(models["eval"][0]), n_seq=4, seq_len=16, n_boot=50
    )
    ds = T.track(series, opts)
    assert ds["update_align_share"].dims == ("run", "step") and ds.sizes["step"] == 2
    for step in ds["step"].values:
        A = ds["update_align"].sel(step=step).isel(run=0).values
        assert float(ds["update_align_share"].sel(step=step).isel(run=0)) == pytest.approx(late_share(A, 0.5))
    assert np.isfinite(ds["update_align_ci_low"].values).all()


def test_a_model_without_a_needed_capability_is_refused_in_one_line(registered, models):
    from depthlens.errors import DepthlensError
    from depthlens.studies import api

    entry = Diagnostic("needs_readouts", f"{MODULE}:update_alignment", "test", needs=("readouts",))
    with registry.register(entry), pytest.raises(DepthlensError, match="needs model capability readouts"):
        api.run("needs_readouts", models["hf"][0], torch.randint(1, 257, (2, 8)))
    with (
        pytest.raises(DepthlensError, match="already registered"),
        registry.register(Diagnostic("update_align", f"{MODULE}:update_alignment", "again")),
    ):
        pass


# --- the example inside the package ----------------------------------------------------------------------------


def _in_tree_checkout(dest: Path) -> Path:
    """A copy of this checkout (what git tracks, as it is in the working tree) under `dest/depthlens`, the natural
    folder name, with the doc's module put where the doc says and its entry added to DIAGNOSTICS."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    root = dest / "depthlens"
    for rel in (f for f in listed.decode().split("\0") if f.split("/")[0] in ("depthlens", "tests", "docs")):
        if (ROOT / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, root / rel)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    if (ROOT / ".mypy_cache").is_dir():  # third-party modules' types, as CI's mypy step left them
        shutil.copytree(ROOT / ".mypy_cache", root / ".mypy_cache")
    engine_src, spec_src = doc_blocks()
    package = root / "depthlens" / "diagnostics" / "update_align"
    package.mkdir()
    (package / "engine.py").write_text(engine_src, encoding="utf-8")
    (package / "__init__.py").write_text(spec_src, encoding="utf-8")
    reg = root / "depthlens" / "diagnostics" / "registry.py"
    text = reg.read_text(encoding="utf-8")
    line = re.search(r"^PACKAGES = \((.*)\)$", text, flags=re.M)
    assert line, "PACKAGES is no longer the one-line tuple this test extends"
    reg.write_text(text.replace(line.group(0), f'PACKAGES = ({line.group(1)}, "update_align")'), encoding="utf-8")
    return root


@pytest.mark.slow
@pytest.mark.skipif(IN_TREE, reason="already inside the copied checkout")
def test_the_example_inside_the_package_passes_ci_and_these_tests(tmp_path):
    root = _in_tree_checkout(tmp_path)
    bin_ = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(root), "DEPTHLENS_WORKED_EXAMPLE_IN_TREE": "1"}

    def run(*cmd: str) -> None:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{' '.join(cmd)}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"

    # the registry edit is formatted as pre-commit would; the package is checked exactly as the doc prints it
    run(str(bin_ / "ruff"), "format", "depthlens/diagnostics/registry.py")
    run(str(bin_ / "ruff"), "check", "depthlens", "tests")
    run(str(bin_ / "ruff"), "format", "--check", "depthlens", "tests")
    run(str(bin_ / "mypy"), "depthlens/diagnostics/update_align", "depthlens/diagnostics/registry.py")
    tests = ["tests/test_architecture.py", "tests/test_registry.py", "tests/test_worked_example.py"]
    run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests)
    import_check = "import depthlens.diagnostics.update_align as m; print(m.__file__)"
    p = subprocess.run([sys.executable, "-c", import_check], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert Path(p.stdout.strip()).is_relative_to(root), p.stdout + p.stderr  # the copy ran, not this checkout

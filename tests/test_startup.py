"""Startup: `--help` and `info` on a native checkpoint import neither torch nor transformer-lens nor transformers
nor datasets; `info` on a native checkpoint (read from its config and safetensors header, no model built) prints
what the model-based description prints and refuses what it refuses; a native model becomes a TransformerLens
HookedRootModule on first use of that surface, with the same hook names, the same cache and the same patching as
one built once transformer-lens is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("transformer_lens", "transformers", "datasets", "torch")
# what `--help` leaves out besides: numpy (no depthlens module it imports needs it) and markdown-it (rich's markdown,
# which typer.rich_utils imports for a markup mode this CLI does not use: cli.app.light_rich_utils)
HELP_FREE = ("numpy", "markdown_it")

# Each command runs in a fork of one process that has imported only `depthlens.cli` (what a fresh `depthlens`
# process imports before its command runs): the imports a command adds are its own, and the interpreter and
# the CLI package start once for all of them instead of once each. A command's stdout goes to OUT/<i>.stdout,
# and its exit code and the heavy modules loaded at its end to OUT/<i>.json.
_PROBE = """
import json, os, runpy, sys, traceback
runs, out = json.loads(sys.argv[1]), sys.argv[2]
import depthlens.cli
for i, args in enumerate(runs):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        continue
    try:
        os.dup2(os.open(os.path.join(out, f"{{i}}.stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        sys.argv = ["depthlens", *args]
        code = 0
        try:
            runpy.run_module("depthlens.cli", run_name="__main__")
        except SystemExit as e:
            code = e.code or 0
        sys.stdout.flush()
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
        help_free = sorted(m for m in sys.modules if m.split(".")[0] in {help_free!r})
        result = {{"code": code, "heavy": heavy, "help_free": help_free}}
    except BaseException:
        result = {{"error": traceback.format_exc()}}
    finally:
        with open(os.path.join(out, f"{{i}}.json"), "w") as f:
            json.dump(result, f)
        os._exit(0)
"""


def _imports_each(runs: list[list[str]], tmp: Path) -> list[dict]:
    """For each argument list, what `depthlens *args` returned, the heavy packages it had imported at its end
    and its stdout (each in a fork of one probe process, _PROBE)."""
    r = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=set(HEAVY), help_free=set(HELP_FREE)), json.dumps(runs), str(tmp)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    outs = []
    for i in range(len(runs)):
        assert (tmp / f"{i}.json").is_file(), (runs[i], r.stderr[-2000:])
        out = json.loads((tmp / f"{i}.json").read_text())
        assert "error" not in out, out.get("error")
        outs.append({**out, "stdout": (tmp / f"{i}.stdout").read_text()})
    return outs


def _imports(args: list[str], tmp: Path) -> dict:
    return _imports_each([args], tmp)[0]


LIGHT = [["--help"], ["info", "checkpoints/hc_l16"], ["info", "checkpoints/hc_l16", "--json"]]
NATIVE = ["hc_l16", "mhc_l16", "full_attnres_l16", "moda_l16", "preln_l16", "keel_l8"]


@pytest.fixture(scope="module")
def light(tmp_path_factory) -> dict[str, dict]:
    """The probes of the LIGHT commands and of `info --json` on each NATIVE checkpoint, in forks of one process."""
    runs = [*LIGHT, *(["info", f"checkpoints/{name}", "--json"] for name in NATIVE if name != "hc_l16")]
    outs = _imports_each(runs, tmp_path_factory.mktemp("probe"))
    return {json.dumps(args): out for args, out in zip(runs, outs, strict=True)}


@pytest.mark.parametrize("args", LIGHT, ids=str)
def test_light_commands_import_no_heavy_package(args, light):
    out = light[json.dumps(args)]
    assert out["code"] == 0
    assert out["heavy"] == []
    if args == ["--help"]:
        assert out["help_free"] == []


# --- `info` on a native checkpoint without torch -----------------------------------------------------------------

ZOO = ROOT / "checkpoints"


@pytest.mark.parametrize("name", NATIVE)
def test_native_info_is_the_model_description(name, light):
    """`info --json` from the config and the safetensors header (in a process that never imports torch) prints
    what `describe(open_model(...))` computes from the built model's parameters."""
    from depthlens.adapters.load import describe, open_model
    from depthlens.cli.app import dumps

    out = light[json.dumps(["info", f"checkpoints/{name}", "--json"])]
    assert out["code"] == 0 and out["heavy"] == []
    fast = json.loads(out["stdout"])
    model = describe(open_model(ZOO / name))
    assert fast.pop("checkpoint") == f"checkpoints/{name}"
    assert fast == json.loads(dumps(model))  # the same fields, values and JSON types
    assert fast["params_design_overhead"] > 0 or name.startswith("preln")


def test_tensor_layout_is_the_built_models():
    """models.layout mirrors the modules: the state dict of a built model of every design, and of the config
    fields that change a tensor (GQA, tied embeddings, static HC, stream count, DeepNorm without final norm, d_ff)."""
    from depthlens.designs import SLUGS
    from depthlens.models import ModelConfig, build_model
    from depthlens.models.layout import tensor_layout

    variants = [
        {},
        {"tie_embeddings": True, "n_kv_head": 2},
        {"hc_dynamic": False, "hc_streams": 2, "deepnorm_final_norm": False, "d_ff": 40, "n_layer": 3},
    ]
    for arch in SLUGS:
        for v in variants:
            cfg = ModelConfig.debug(arch, **v)
            built = {k: tuple(t.shape) for k, t in build_model(cfg).state_dict().items()}
            if cfg.tie_embeddings:
                built.pop("lm_head.weight")  # stored once, as the embedding
            assert tensor_layout(cfg) == built, (arch, v)


def _edit(src, dst, how):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = dst / "model.safetensors"
    t = load_file(str(w))
    if how == "transposed":  # the same parameter count, a wrong shape
        t["blocks.1.mlp.fn.up_proj.weight"] = t["blocks.1.mlp.fn.up_proj.weight"].T.contiguous()
    elif how == "nan":
        t["blocks.0.router_attn.static_alpha"][0, 0] = float("nan")
    elif how == "f64_overflow":  # finite as stored, +inf in float32, the dtype the model computes in
        t["norm.weight"] = t["norm.weight"].double()
        t["norm.weight"][0] = 1e300
    elif how == "extra":
        t["blocks.0.extra"] = t["norm.weight"].clone()
    elif how == "missing":
        t.pop("blocks.2.router_mlp.static_beta")
    elif how.startswith("bf16"):  # read by its exponent bits (numpy has no bfloat16)
        t = {k: v.bfloat16() for k, v in t.items()}
        if how == "bf16_inf":
            t["blocks.3.mlp.fn.down_proj.weight"][1, 2] = float("-inf")
    save_file(t, str(w))
    return dst


def test_native_info_reads_bfloat16(tmp_path):
    from depthlens.adapters.load import describe, describe_native, open_model

    ck = _edit(ZOO / "hc_l4", tmp_path / "bf16", "bf16")
    fast = describe_native(ck)
    assert fast is not None and fast == describe(open_model(ck))


@pytest.mark.parametrize("how", ["transposed", "nan", "f64_overflow", "extra", "missing", "bf16_inf"])
def test_native_info_refuses_what_the_model_refuses(tmp_path, how):
    """A checkpoint the header path cannot vouch for goes to the model path: the same one line as loading it."""
    from typer.testing import CliRunner

    from depthlens.adapters.load import describe_native
    from depthlens.cli import app
    from depthlens.errors import CheckpointError
    from depthlens.io.checkpoint import load

    bad = _edit(ZOO / "hc_l4", tmp_path / "bad", how)
    assert describe_native(bad) is None
    with pytest.raises(CheckpointError) as e:
        load(bad)
    r = CliRunner().invoke(app, ["info", str(bad)])
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [f"depthlens: error: {e.value}"]


@pytest.mark.slow
def test_the_probe_sees_a_heavy_import(tmp_path):
    """The probe is not blind: a command that builds a TransformerLens object shows transformer_lens."""
    out = _imports(["hooks", "checkpoints/hc_l16"], tmp_path)
    assert out["code"] == 0
    assert "transformer_lens" in out["heavy"]


def test_lens_attrs_cover_hooked_root_module():
    """Every public attribute HookedRootModule adds to nn.Module switches a lazy model to TransformerLens."""
    from torch import nn
    from transformer_lens import HookedRootModule

    from depthlens.models.lens_root import LENS_ATTRS

    added = {a for a in dir(HookedRootModule) if not a.startswith("_")} - set(dir(nn.Module))
    assert added <= LENS_ATTRS


_LAZY = """
import copy, json, sys
import torch
from depthlens.models import ModelConfig, build_model

ARCHS = {archs!r}
cfgs = {{a: ModelConfig.debug(a, n_layer=2) for a in ARCHS}}
tokens = {{a: torch.randint(0, c.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1)) for a, c in cfgs.items()}}
lazy, plain, seen = {{}}, {{}}, {{a: [] for a in ARCHS}}
for a in ARCHS:  # every model built and run before any switch: none of them imports transformer-lens
    lazy[a] = build_model(cfgs[a], seed=3).eval()
    lazy[a].blocks[1].hook_resid_post.register_forward_hook(lambda m, i, o, a=a: seen[a].append(o.shape))
    with torch.no_grad():
        plain[a] = lazy[a](tokens[a])
before = "transformer_lens" in sys.modules
out = {{}}
for a in ARCHS:
    cfg, toks, model = cfgs[a], tokens[a], lazy[a]
    names = model.hook_names()  # the switch
    from transformer_lens import HookedRootModule
    from transformer_lens.hook_points import HookPoint
    eager = build_model(cfg, seed=3).eval()
    with torch.no_grad():
        l_out, l_cache = model.run_with_cache(toks)
        e_out, e_cache = eager.run_with_cache(toks)
        doubled = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 2 * x)])
        e_doubled = eager.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 2 * x)])
    again = type(model)(cfg)
    twin = copy.deepcopy(model)
    out[a] = {{
        "before": before,
        "same_names": names == eager.hook_names() and sorted(l_cache.keys()) == sorted(e_cache.keys()),
        "cached_all": set(l_cache.keys()) <= set(names) and len(l_cache.keys()) > 10,
        "n_names": len(names),
        "plain_equal": torch.equal(plain[a], l_out) and torch.equal(l_out, e_out),
        "cache_equal": all(torch.equal(l_cache[k], e_cache[k]) for k in e_cache.keys()),
        "edit_equal": torch.equal(doubled, e_doubled) and not torch.equal(doubled, l_out),
        "is_lens": isinstance(model, HookedRootModule) and isinstance(model, type(eager).__mro__[1]),
        "hook_types": all(type(model.hook_dict[n]) is HookPoint for n in names),
        "names_set": all(model.hook_dict[n].name == n for n in names),
        "torch_hook_kept": len(seen[a]) >= 3,
        "again_lens": isinstance(again, HookedRootModule) and list(again.hook_dict) == names,
        "twin_lens": list(twin.hook_dict) == names and twin.hook_dict[names[0]] is not model.hook_dict[names[0]],
    }}
print(json.dumps(out))
"""
LAZY_ARCHS = ("preln", "hc", "moda", "sandwich")


@pytest.fixture(scope="module")
def lazy_results() -> dict:
    """One process for the four designs (transformer-lens imported once, after all four were built and run)."""
    r = subprocess.run(
        [sys.executable, "-c", _LAZY.format(archs=LAZY_ARCHS)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", LAZY_ARCHS)
def test_lazy_model_becomes_the_eager_one(arch, lazy_results):
    out = dict(lazy_results[arch])
    assert out.pop("before") is False  # built and run without transformer-lens
    assert out.pop("n_names") > 10
    assert out == dict.fromkeys(out, True)

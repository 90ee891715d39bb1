"""Startup: `--help` and `info` on a native checkpoint import neither transformer-lens nor transformers nor
datasets; a native model becomes a TransformerLens HookedRootModule on first use of that surface, with the
same hook names, the same cache and the same patching as one built once transformer-lens is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("transformer_lens", "transformers", "datasets")

_PROBE = """
import json, runpy, sys
sys.argv = ["depthlens", *json.loads(sys.argv[1])]
code = 0
try:
    runpy.run_module("depthlens.cli", run_name="__main__")
except SystemExit as e:
    code = e.code or 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("\\n@@" + json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


def _imports(args: list[str]) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=set(HEAVY)), json.dumps(args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("@@")]
    assert line, r.stderr[-2000:]
    return json.loads(line[-1][2:])


@pytest.mark.parametrize(
    "args", [["--help"], ["info", "checkpoints/hc_l16"], ["info", "checkpoints/hc_l16", "--json"]], ids=str
)
def test_light_commands_import_no_heavy_package(args):
    out = _imports(args)
    assert out["code"] == 0
    assert out["heavy"] == []


def test_the_probe_sees_a_heavy_import():
    """The probe is not blind: a command that builds a TransformerLens object shows transformer_lens."""
    out = _imports(["hooks", "checkpoints/hc_l16"])
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

cfg = ModelConfig.debug({arch!r}, n_layer=2)
tokens = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
lazy = build_model(cfg, seed=3).eval()
before = "transformer_lens" in sys.modules
seen = []
lazy.blocks[1].hook_resid_post.register_forward_hook(lambda m, i, o: seen.append(o.shape))  # before the switch
with torch.no_grad():
    plain = lazy(tokens)
names = lazy.hook_names()  # the switch
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint
eager = build_model(cfg, seed=3).eval()
with torch.no_grad():
    l_out, l_cache = lazy.run_with_cache(tokens)
    e_out, e_cache = eager.run_with_cache(tokens)
    doubled = lazy.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 2 * x)])
    e_doubled = eager.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 2 * x)])
again = type(lazy)(cfg)
twin = copy.deepcopy(lazy)
print(json.dumps({{
    "before": before,
    "same_names": names == eager.hook_names() and sorted(l_cache.keys()) == sorted(e_cache.keys()),
    "cached_all": set(l_cache.keys()) <= set(names) and len(l_cache.keys()) > 10,
    "n_names": len(names),
    "plain_equal": torch.equal(plain, l_out) and torch.equal(l_out, e_out),
    "cache_equal": all(torch.equal(l_cache[k], e_cache[k]) for k in e_cache.keys()),
    "edit_equal": torch.equal(doubled, e_doubled) and not torch.equal(doubled, l_out),
    "is_lens": isinstance(lazy, HookedRootModule) and isinstance(lazy, type(eager).__mro__[1]),
    "hook_types": all(type(lazy.hook_dict[n]) is HookPoint for n in names),
    "names_set": all(lazy.hook_dict[n].name == n for n in names),
    "torch_hook_kept": len(seen) >= 3,
    "again_lens": isinstance(again, HookedRootModule) and list(again.hook_dict) == names,
    "twin_lens": list(twin.hook_dict) == names and twin.hook_dict[names[0]] is not lazy.hook_dict[names[0]],
}}))
"""


@pytest.mark.parametrize("arch", ["preln", "hc", "moda", "sandwich"])
def test_lazy_model_becomes_the_eager_one(arch):
    r = subprocess.run(
        [sys.executable, "-c", _LAZY.format(arch=arch)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("before") is False  # built and run without transformer-lens
    assert out.pop("n_names") > 10
    assert out == dict.fromkeys(out, True)

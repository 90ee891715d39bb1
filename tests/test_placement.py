"""device_map placement of HF models over several devices, checked without a GPU.

- "auto": the contiguous balanced split, against a brute force over every cut;
- the plumbing: a model placed part by part gives exactly the unplaced model's diagnostics;
- the moves: a model split over ["cpu", "meta"] runs end to end (a meta tensor meeting a CPU one raises, so
  every state, keep mask, rotary table and mask a layer receives must be on that layer's device), and a spy
  on each decoder layer checks what it receives.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from depthlens.adapters.placement import (
    PartSizes,
    Placement,
    auto_placement,
    contiguous_split,
    parse_device_map,
    resolve_device_map,
)
from depthlens.errors import DepthlensError


def _llama(seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    from depthlens.adapters.hf import HFLayeredModel, debug_config

    torch.manual_seed(seed)
    return HFLayeredModel(AutoModelForCausalLM.from_config(debug_config("llama", **kw)).eval())


# --- "auto" -------------------------------------------------------------------------------------------------


def test_auto_split_of_an_even_model_over_two_and_four_gpus():
    sizes = PartSizes(embed=10, layers=(5,) * 8, head=10)
    p = auto_placement(sizes, ["cuda:0", "cuda:1"])
    assert p.embed == p.head == torch.device("cuda:0")  # logits come back where the token ids are
    assert [d.index for d in p.layers] == [0, 0, 1, 1, 1, 1, 1, 1]  # 10+10+2·5 = 30 | 6·5 = 30
    p4 = auto_placement(sizes, [f"cuda:{i}" for i in range(4)])
    loads = [0] * 4
    for d, w in zip([p4.embed, *p4.layers], [20, *[5] * 8]):
        loads[d.index] += w
    assert max(loads) == 20 and min(loads) > 0  # embed+head alone is 20: the optimum, every GPU used
    assert [d.index for d in p4.layers] == sorted(d.index for d in p4.layers)  # contiguous, in model order


def test_tied_head_must_share_the_embeddings_device():
    with pytest.raises(DepthlensError, match="tied"):
        resolve_device_map(
            {"embed": "cuda:0", "layers": ["cuda:0"] * 8, "head": "cuda:1"}, PartSizes(10, (5,) * 8, 0, tied=True)
        )
    p = resolve_device_map({"embed": "cuda:0", "layers": ["cuda:0"] * 8, "head": "cuda:1"}, PartSizes(10, (5,) * 8, 10))
    assert p.head == torch.device("cuda:1") and p.devices == [torch.device("cuda:0"), torch.device("cuda:1")]


@pytest.mark.parametrize("seed", range(6))
def test_contiguous_split_is_the_optimum_of_a_brute_force(seed):
    rng = np.random.default_rng(seed)
    w = [int(x) for x in rng.integers(1, 50, size=9)]
    for k in (2, 3):
        part = contiguous_split(w, k)
        assert part == sorted(part) and part[0] == 0  # contiguous runs, in model order
        got = max(sum(x for x, p in zip(w, part) if p == j) for j in set(part))
        best = min(
            max(sum(w[a:b]) for a, b in zip((0, *cuts), (*cuts, len(w))))
            for cuts in itertools.combinations(range(1, len(w)), k - 1)
        )
        assert got == best


def test_device_map_refusals_are_one_line():
    sizes = PartSizes(1, (1, 1), 1)
    for bad, msg in (
        ({"embed": "cpu", "layers": ["cpu"]}, "field 'head'"),
        ({"embed": "cpu", "layers": ["cpu"] * 3, "head": "cpu"}, "one device per layer"),
        ({"embed": "gpu9", "layers": "cpu", "head": "cpu"}, "expected a device name"),
        (3.5, "must be"),
    ):
        with pytest.raises(DepthlensError, match=msg):
            resolve_device_map(bad, sizes)
    with pytest.raises(DepthlensError, match="visible CUDA"):
        resolve_device_map("auto", sizes, devices=[])
    assert parse_device_map('{"embed": "cpu", "layers": "cpu", "head": "cpu"}')["layers"] == "cpu"
    assert parse_device_map("auto") == "auto"


# --- plumbing: a placed model equals the unplaced one exactly --------------------------------------------------


def test_placed_model_gives_the_unplaced_diagnostics_exactly():
    from depthlens.diagnostics import registry
    from depthlens.runtime.evaldata import random_eval_data

    data = random_eval_data(101, n_seq=3, seq_len=16, seed=0, bos_id=1)
    ref, placed = _llama(), _llama()
    placed.place({"embed": "cpu", "layers": ["cpu"] * 4, "head": "cpu"})
    assert placed.placement.as_dict()["layers"] == ["cpu"] * 4
    for name, opts, var in (
        ("causal", {"norm": "resid"}, "causal_score"),
        ("permutation", {"pairs": "all"}, "perm_kl"),
        ("angular", {}, "angular_distance"),
    ):
        a, b = registry.run(name, ref, data, **opts), registry.run(name, placed, data, **opts)
        np.testing.assert_array_equal(a[var].values, b[var].values)


# --- the moves: a model split over cpu and meta ---------------------------------------------------------------


def _spy(model):
    """Record, per decoder layer call, the devices of everything it receives."""
    seen: list[tuple[int, set]] = []

    def pre(i):
        def hook(mod, args, kwargs):
            devs = {t.device for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)}
            pe = kwargs.get("position_embeddings")
            devs |= {t.device for t in (pe or ())}
            seen.append((i, devs))

        return hook

    for i, layer in enumerate(model.layers):
        layer.self_attn.register_forward_pre_hook(pre(i), with_kwargs=True)
    return seen


def test_split_model_moves_every_input_to_each_layers_device():
    m = _llama()
    m.place({"embed": "cpu", "layers": ["cpu", "cpu", "meta", "meta"], "head": "meta"})
    assert m.input_device == torch.device("cpu")
    assert {p.device for p in m.layers[3].parameters()} == {torch.device("meta")}
    seen = _spy(m)
    toks = torch.randint(0, 101, (2, 8))
    ctx = m.context(8)
    assert ctx.cos.device == torch.device("cpu")  # the tables start at the embedding
    keep = {2: torch.ones(2, 8, dtype=torch.bool), 3: torch.zeros(2, 8, dtype=torch.bool)}  # host masks
    updates = {}
    state = m.run_layers(
        m.embed(toks, ctx),
        ctx,
        keep=keep,
        order=[0, 1, 3, 2],
        on_layer=lambda p, s, u: updates.setdefault(p, (s["h"].device, u.device)),
    )
    logits = m.head(state, ctx)
    assert logits.shape == (2, 8, 101) and logits.device == torch.device("meta")
    want = {0: "cpu", 1: "cpu", 3: "meta", 2: "meta"}  # layer 3 ran at position 2, layer 2 at position 3
    assert [(i, {d.type for d in devs}) for i, devs in seen] == [(i, {want[i]}) for i in (0, 1, 3, 2)]
    assert {p: (a.type, b.type) for p, (a, b) in updates.items()} == {
        0: ("cpu", "cpu"),
        1: ("cpu", "cpu"),
        2: ("meta", "meta"),
        3: ("meta", "meta"),
    }
    assert ("rope", torch.device("meta")) in ctx.extras  # one copy of the tables per device, cached


def test_open_model_places_an_hf_directory_and_records_the_map(tmp_path):
    from transformers import AutoModelForCausalLM

    from depthlens.adapters.hf import debug_config
    from depthlens.adapters.load import open_model

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(debug_config("llama")).save_pretrained(str(tmp_path), safe_serialization=True)
    mp = {"embed": "cpu", "layers": ["cpu", "cpu", "cpu", "meta"], "head": "meta"}
    op = open_model(tmp_path, device_map=mp)
    assert json.loads(op.provenance["device_map"]) == mp
    assert op.model.layers[3].mlp.up_proj.weight.device == torch.device("meta")
    assert isinstance(op.model.placement, Placement)


def test_cli_device_map_is_refused_for_a_depthlens_checkpoint_and_auto_without_gpus(tmp_path):
    from typer.testing import CliRunner

    import depthlens
    from depthlens.cli import app
    from depthlens.models import ModelConfig, build_model

    ck = depthlens.save(build_model(ModelConfig.debug("preln", vocab_size=257, max_seq_len=32)), tmp_path / "m")
    r = CliRunner().invoke(
        app,
        ["angular", str(ck), "--device-map", "auto", "--n-seq", "2", "--seq-len", "8", "--out", str(tmp_path / "a.nc")],
    )
    assert r.exit_code == 1 and "device_map applies to Hugging Face" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "a.nc").exists()


# --- the generic-blocks path (families without a hand-mapped adapter) ---------------------------------------


def _neox():
    from transformers import AutoConfig, AutoModelForCausalLM

    from depthlens.adapters.hf import wrap

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "gpt_neox",
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return wrap(AutoModelForCausalLM.from_config(cfg).eval())


def test_generic_blocks_placed_equals_unplaced_and_moves_each_blocks_inputs():
    from depthlens.adapters.generic import GenericBlocksModel
    from depthlens.diagnostics import registry
    from depthlens.runtime.evaldata import random_eval_data

    ref, placed = _neox(), _neox()
    assert isinstance(placed, GenericBlocksModel)
    placed.place({"embed": "cpu", "layers": "cpu", "head": "cpu"})
    data = random_eval_data(101, n_seq=2, seq_len=12, seed=0)
    for name, opts, var in (
        ("causal", {"variants": ("current",)}, "causal_score"),
        ("permutation", {"pairs": "all"}, "perm_abs"),
    ):
        np.testing.assert_array_equal(
            registry.run(name, ref, data, **opts)[var].values, registry.run(name, placed, data, **opts)[var].values
        )
    with pytest.raises(DepthlensError, match="head on the embedding"):
        _neox().place({"embed": "cpu", "layers": "cpu", "head": "meta"})

    g = _neox().place({"embed": "cpu", "layers": ["cpu", "cpu", "meta", "meta"], "head": "cpu"})
    seen: list[tuple[int, set]] = []
    for i, block in enumerate(g.layers):
        block.register_forward_pre_hook(
            (
                lambda n: (
                    lambda m, a, k: seen.append(
                        (
                            n,
                            {
                                t.device.type
                                for t in (*a, *k.values(), *(k.get("position_embeddings") or ()))
                                if isinstance(t, torch.Tensor)
                            },
                        )
                    )
                )
            )(i),
            with_kwargs=True,
        )
    ctx = g.context(8)
    h0 = g.embed(torch.randint(0, 101, (2, 8)), ctx)
    seen.clear()  # the context probe and embed's stop at block 0 are not block calls
    keep = {3: torch.zeros(2, 8)}  # a host mask for a block on meta
    state = g.run_layers(h0, ctx, keep=keep)
    assert state["h"].device.type == "meta" and state["h"].shape == (2, 8, 32)
    assert seen == [(0, {"cpu"}), (1, {"cpu"}), (2, {"meta"}), (3, {"meta"})]

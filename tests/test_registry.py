"""The diagnostic registry (depthlens.diagnostics.registry) and the design capability flags it reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.designs import CAPABILITIES, DESIGNS, SLUGS, has_capability
from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.runtime.evaldata import EvalData
from helpers import debug_model

PKG = Path(__file__).parents[1] / "depthlens"


def test_names_and_aliases_resolve_to_one_declaration():
    # table and summary.json order: the share columns, then erank and k*, then angular; a diagnostic added to the
    # package later may sit anywhere, so the shipped ones are checked as an ordered subsequence
    shipped = ("causal", "permutation", "rank", "attnres", "angular", "mixing", "logit_lens", "tuned_lens")
    assert [n for n in registry.NAMES if n in shipped] == list(shipped)
    assert len(set(registry.NAMES)) == len(registry.NAMES)
    assert registry.names() == registry.NAMES  # nothing registered
    perm = registry.get("permutation")
    assert registry.get("permute") is perm and registry.get("perm") is perm  # the CLI command, the record prefix
    assert perm.prefix == "perm" and registry.get("causal").prefix == "causal"
    with pytest.raises(DepthlensError, match="unknown diagnostic 'perms'; choose from causal, permutation"):
        registry.get("perms")


def test_default_thresholds_and_units():
    """The headline thresholds (docs/concepts.md#causal-score, #permutation-score), typed independently here."""
    documented = {"causal": 0.45, "direct": 0.45, "perm_abs": 0.15, "perm_rel": 0.15, "perm_kl": 0.15}
    assert {k: registry.THRESHOLDS[k] for k in documented} == documented
    assert set(registry.THRESHOLDS) == {s.key for d in registry.DIAGNOSTICS for s in d.scores}  # one per score
    assert registry.score("perm_abs").unit == "nat" and registry.score("causal").unit == "1"
    # sweepable: every score computed by default (direct needs --direct); the shipped ones in their order
    assert set(registry.SWEEPABLE) == {s.key for d in registry.DIAGNOSTICS for s in d.scores if not s.optional}
    assert [k for k in registry.SWEEPABLE if k in documented] == ["causal", "perm_abs", "perm_rel", "perm_kl"]
    assert registry.score_owner("perm_kl")[0].name == "permutation"
    assert not registry.score("direct").bootstraps and registry.get("causal").bootstraps
    assert not registry.get("angular").bootstraps and registry.get("angular").headline is None


def test_engines_and_figures_resolve():
    for d in registry.DIAGNOSTICS:
        hooks = d.loaded()
        assert callable(hooks.engine), d.name
        assert hooks.figure is None or callable(hooks.figure), d.name
        # --precision offers the diagnostics that name what they re-derive: exactly those with a regrow hook
        assert bool(d.regrown) == (hooks.regrow is not None), d.name
        # a command of its own (`Diagnostic.command`) is planned and printed by its hook; the generic one is not
        assert (d.command is not None) == (hooks.command is not None), d.name


def _thresholds_typed(path: Path) -> list[str]:
    """0.45 / 0.15 typed as a number outside arithmetic, or inside a string (help texts, titles)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    arith = {id(n) for b in ast.walk(tree) if isinstance(b, ast.BinOp) for n in (b.left, b.right)}
    out = []
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Constant)
            and id(n) not in arith
            and (
                (type(n.value) is float and n.value in (0.45, 0.15))
                or (isinstance(n.value, str) and ("0.45" in n.value or "0.15" in n.value))
            )
        ):
            out.append(f"{path.relative_to(PKG.parent)}:{n.lineno}")
    return out


QUOTED = {
    "depthlens/stats/orderings.py",  # DepthBench's claims in the paper's own words (its θ, not a default)
    # the coverage simulation's synthetic scores are cut where the report cuts real ones; its committed coverage
    # table (seeded) was computed at these cuts, so they are part of that model, not a default a user meets
    "depthlens/stats/crossed.py",
}


def test_default_thresholds_are_typed_once():
    hits = [
        h
        for p in sorted(PKG.rglob("*.py"))
        if str(p.relative_to(PKG.parent)) not in QUOTED
        for h in _thresholds_typed(p)
    ]
    # typed where each score is declared: in its diagnostic package (depthlens/diagnostics/<name>/headline.py)
    assert hits and all(re.match(r"depthlens/diagnostics/\w+/headline\.py:", h) for h in hits), hits


@pytest.mark.parametrize("slug", SLUGS)
def test_capabilities_match_what_the_models_do(slug):
    """A capability flag is a claim about the model: multistream ⇔ the design's state has streams and it
    writes res_map readouts; depth_softmax ⇔ it writes alpha readouts (the input of the attnres engine)."""
    torch.manual_seed(0)
    model = debug_model(slug, n_layer=2)
    keys = set(model.readouts(torch.randint(0, model.config.vocab_size, (1, 8))))
    assert has_capability(slug, "multistream") == bool(model.design.multi_stream) == ("sub0.res_map" in keys)
    assert has_capability(slug, "depth_softmax") == ("sub0.alpha" in keys)
    assert DESIGNS[slug].multi_stream == has_capability(slug, "multistream")
    assert registry.get("rank").applies(slug) == (slug in ("hc", "mhc"))
    assert registry.get("attnres").applies(slug) == (slug in ("full_attnres", "block_attnres"))
    assert registry.get("causal").applies(slug) and registry.get("mixing").applies(slug)


def test_unknown_capability_is_refused():
    assert set(CAPABILITIES) == {"multistream", "depth_softmax", "stochastic_maps"}
    assert [s for s in DESIGNS if has_capability(s, "stochastic_maps")] == ["mhc"]
    with pytest.raises(ValueError, match="unknown design capability 'streams'"):
        has_capability("hc", "streams")
    assert not has_capability("gpt2-foreign", "multistream")


def test_run_dispatches_to_the_engine_with_the_options_as_given():
    """registry.run(name) is the engine call itself: same Dataset as calling the engine directly."""
    from depthlens.diagnostics.angular.engine import angular_distances

    torch.manual_seed(0)
    model = debug_model("preln", n_layer=2)
    data = EvalData.from_tokens(torch.randint(0, model.config.vocab_size, (2, 12)))
    got = registry.run("angular", model, data, positions="all")
    want = angular_distances(model, data, positions="all")
    assert got["angular_distance"].equals(want["angular_distance"])
    assert got.attrs["positions"] == want.attrs["positions"] == "all"


# --- readout keys (depthlens.models.readouts) ---------------------------------------------------------------


def test_readout_key_round_trip_and_refusals():
    from depthlens.models.readouts import ReadoutKey, parse_readout_key, readout_key, sublayer_label

    assert readout_key("res_map", sublayer=3) == "sub3.res_map"
    assert readout_key("res_map", sublayer=3, static=True) == "static.sub3.res_map"
    assert readout_key("alpha", final=True) == "final.alpha" and readout_key("h0") == "h0"
    for key in ("sub12.alpha", "static.final.w", "h0", "static.sub0.H_res", "final.self_weight"):
        p = parse_readout_key(key)
        assert readout_key(p.name, p.sublayer, static=p.static, final=p.final) == key
    assert parse_readout_key("static.sub3.res_map") == ReadoutKey("res_map", 3, True, False)
    for bad in ("sub.alpha", "sub3.", "sub3.res.map", "3.alpha"):
        with pytest.raises(ValueError):
            parse_readout_key(bad)
    with pytest.raises(ValueError):
        readout_key("alpha", sublayer=2, final=True)
    with pytest.raises(ValueError):
        readout_key("alpha", sublayer=-1)
    assert [sublayer_label(j) for j in range(4)] == ["attn_0", "mlp_0", "attn_1", "mlp_1"]


@pytest.mark.parametrize("slug", SLUGS)
def test_every_readout_a_model_writes_parses(slug):
    """No design writes a key that `readout_key` could not have built."""
    from depthlens.models.readouts import parse_readout_key, readout_key

    torch.manual_seed(0)
    model = debug_model(slug, n_layer=2)
    for key in model.readouts(torch.randint(0, model.config.vocab_size, (1, 8))):
        p = parse_readout_key(key)
        assert readout_key(p.name, p.sublayer, static=p.static, final=p.final) == key


def test_readouts_accessors_build_the_keys():
    """`Readouts` (what `model.readouts` returns) answers by name what `readout_key` strings index."""
    from depthlens.models.readouts import Readouts, readout_key

    torch.manual_seed(0)
    model = debug_model("deepnorm", n_layer=2)
    rec = model.readouts(torch.randint(0, model.config.vocab_size, (2, 8)))
    assert isinstance(rec, Readouts)
    assert rec.sublayers_with("branch_share") == [0, 1, 2, 3]
    for j, v in enumerate(rec.per_sublayer("branch_share", 4)):
        assert v is rec[readout_key("branch_share", j)] is rec.sublayer("branch_share", j)
    assert rec.model("h0") is rec["h0"] and rec.has("rms", 1) and not rec.has("res_map", 1)
    with pytest.raises(KeyError):
        rec.sublayer("res_map", 0)
    hc = debug_model("hc", n_layer=2).readouts(torch.randint(0, 97, (1, 8)))
    assert hc.static("res_map", 1) is hc["static.sub1.res_map"]
    full = debug_model("full_attnres", n_layer=2).readouts(torch.randint(0, 97, (1, 8)))
    assert full.final("alpha") is full["final.alpha"]


def test_capabilities_are_what_a_model_offers():
    from depthlens.models.protocol import capabilities

    model = debug_model("preln", n_layer=2)
    assert capabilities(model) == {"layers", "readouts", "depth_mixing", "unembedding"}
    assert capabilities(object()) == frozenset()
    assert registry.get("rank").missing(object()) == ("readouts",)
    assert registry.get("angular").missing(model) == ()


def test_register_adds_for_the_block_only():
    d = registry.Diagnostic("toy", "depthlens.diagnostics.angular.engine:angular_distances", "toy", aliases=("toy2",))
    with registry.register(d):
        assert registry.get("toy2") is d and registry.names()[-1] == "toy"
        with (
            pytest.raises(DepthlensError, match="already registered"),
            registry.register(registry.Diagnostic("x", "m:f", "x", aliases=("toy",))),
        ):
            pass
    assert "toy" not in registry.aliases() and registry.names() == registry.NAMES


def test_api_compare_by_registry_name_equals_compare_by_function():
    from depthlens.studies import api

    torch.manual_seed(0)
    models = [debug_model("preln", n_layer=4, seed=0), debug_model("hc", n_layer=4, seed=1)]
    data = EvalData.from_tokens(torch.randint(0, models[0].config.vocab_size, (2, 12)))
    by_name = api.compare("permute", models, data, names=["a", "b"])
    by_fn = api.compare(api.permutation, models, data, names=["a", "b"])
    assert by_name["perm_abs"].dims[0] == "checkpoint" and list(by_name["checkpoint"].values) == ["a", "b"]
    np.testing.assert_array_equal(by_name["perm_abs"].values, by_fn["perm_abs"].values)
    with pytest.raises(DepthlensError, match="unknown diagnostic"):
        api.compare("permutations", models, data)


def test_a_typed_option_refuses_what_its_command_must_not_run_on():
    eps = registry.Option("eps", float, 0.05, "help", 0.0, 1.0)
    assert eps.check(0.0) is None and eps.check(1.0) is None and eps.check(0.05) is None
    for bad in (-0.1, 1.5, float("nan"), float("inf")):
        assert eps.check(bad) == f"--eps must be a finite number in [0, 1], got {bad}"
    pos = registry.Option("positions", str, "last", "help", choices=("last", "all"))
    assert pos.check("all") is None and pos.check("some") == "--positions must be one of last, all; got 'some'"
    assert registry.Option("block_size", int, 1, "help").flag == "--block-size"


def test_a_typed_option_that_clashes_with_the_commands_own_is_refused_when_built():
    from depthlens.cli.diagnostic import command_for
    from depthlens.errors import DepthlensError

    d = registry.Diagnostic(
        "clashing",
        "depthlens.diagnostics.angular.engine:angular_distances",
        "x",
        options=(registry.Option("seed", int, 0, "h"),),
    )
    with pytest.raises(DepthlensError, match=r"\['seed'\].*clash"):
        command_for(d)

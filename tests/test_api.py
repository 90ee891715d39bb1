"""The Python API is the CLI's twin: `import depthlens as dl; dl.causal(...)` with typed keywords, the CLI's option
names and defaults, a progress switch, the old module path still working with a deprecation warning."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import depthlens as dl
from depthlens.studies import api
from helpers import cli_commands

NAMED = {  # API function -> CLI command
    "causal": "causal",
    "permute": "permute",
    "angular": "angular",
    "rank": "rank",
    "attnres": "attnres",
}


def test_the_facade_names_are_the_api_functions():
    for name in ("causal", "permute", "permutation", "angular", "rank", "effective_rank", "attnres", "compare"):
        assert getattr(dl, name) is getattr(api, name), name
        assert name in dl.__all__
    assert dl.permute is dl.permutation and dl.rank is dl.effective_rank


@pytest.mark.parametrize("name", sorted(NAMED))
def test_options_are_typed_keywords_with_the_clis_names_and_defaults(name):
    fn = getattr(api, name)
    sig = inspect.signature(fn)
    assert not [p for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD], f"{name} takes **opts"
    assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name
    assert fn.__doc__ and "Returns" in fn.__doc__ and "Dataset" in fn.__doc__
    cmd = cli_commands()[NAMED[name]]
    cli = {p.name: p.default for p in cmd.params if p.param_type_name == "option"}
    shared = [k for k in sig.parameters if k in cli]
    assert {"n_seq", "seed", "seq_len", "tokens", "batch_size", "device"} <= set(shared), shared
    for k in shared:
        if k == "dtype":  # the CLI's "fp32" is the API's None (= fp32); both take the same names
            assert cli[k] == "fp32" and sig.parameters[k].default is None
            continue
        assert sig.parameters[k].default == cli[k], (name, k, sig.parameters[k].default, cli[k])


def test_the_default_is_one_variant_as_the_cli_and_the_old_spelling_warns():
    from depthlens.models import ModelConfig, build_model

    model = build_model(ModelConfig.debug("preln", n_layer=3), seed=0)
    toks = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    ds = dl.causal(model, toks, progress=False)
    assert list(ds["variant"].values) == ["current"]
    both = dl.causal(model, toks, variant="future", progress=False)
    assert list(both["variant"].values) == ["current", "future"]
    with pytest.warns(DeprecationWarning, match="variant="):
        old = dl.causal(model, toks, variants=("current",), progress=False)
    assert old["causal_score"].equals(ds["causal_score"])
    with pytest.warns(DeprecationWarning, match="layers="):
        p_old = dl.permute(model, toks, pairs="all", progress=False)
    assert p_old["perm_abs"].equals(dl.permute(model, toks, layers="all", progress=False)["perm_abs"])


def test_progress_false_draws_nothing_and_true_draws_a_bar(capsys):
    from depthlens.models import ModelConfig, build_model

    model = build_model(ModelConfig.debug("preln", n_layer=3), seed=0)
    toks = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    dl.angular(model, toks, progress=False)
    assert capsys.readouterr().err == ""
    dl.angular(model, toks)
    err = capsys.readouterr().err
    assert "angular preln" in err and "1/1" in err, err  # one batch, counted to its end


def test_the_old_module_path_warns_and_resolves_to_the_new_one():
    import importlib
    import sys

    sys.modules.pop("depthlens.analysis.api", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("depthlens.analysis.api")
    assert any(issubclass(w.category, DeprecationWarning) and "depthlens as dl" in str(w.message) for w in caught)
    assert old.causal is api.causal and old.compare is api.compare

"""Layer-pruning curves against an independent computation: the model rebuilt without the removed layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.diagnostics.pruning import _Pruner, add_criteria, permutation_importance, pruning_curves
from depthlens.errors import DepthlensError
from depthlens.models import ModelConfig, build_model
from depthlens.runtime.evaldata import EvalData

L = 6


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    cfg = ModelConfig.debug("preln", n_layer=L)
    model = build_model(cfg, seed=3).eval()
    with torch.no_grad():  # make layers differ in importance (a random init makes them all alike)
        for l, block in enumerate(model.blocks):
            block.mlp.fn.down_proj.weight.mul_(0.2 + l)
    data = EvalData.from_tokens(torch.randint(0, cfg.vocab_size, (5, 24), generator=torch.Generator().manual_seed(0)))
    return cfg, model, data


def _loss_without(cfg, model, data, removed):
    """Independent: a Pre-LN model of L - k layers holding the kept layers' weights, run by its plain forward."""
    kept = [l for l in range(L) if l not in removed]
    small = build_model(ModelConfig.debug("preln", n_layer=len(kept)), seed=0).eval()
    sd = {}
    for name, value in model.state_dict().items():
        if name.startswith("blocks."):
            l = int(name.split(".")[1])
            if l in kept:
                sd[f"blocks.{kept.index(l)}." + name.split(".", 2)[2]] = value
        else:
            sd[name] = value
    small.load_state_dict(sd)
    with torch.no_grad():
        logits = small(data.tokens)[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), data.tokens[:, 1:].reshape(-1)).item()


@pytest.mark.parametrize("removed", [[], [0], [5], [2, 3], [0, 4, 5], [1, 2, 3]])
def test_removal_equals_the_model_without_those_layers(setup, removed):
    cfg, model, data = setup
    pruner = _Pruner(model, data, batch_size=2)  # 3 batches: the sum over batches is checked too
    assert pruner.loss(removed) == pytest.approx(_loss_without(cfg, model, data, removed), abs=2e-6)


def test_curves(setup):
    cfg, model, data = setup
    ds = pruning_curves(model, data, k_max=3, n_random=4, seed=1)
    assert ds.attrs["metric"] == "pruning" and list(ds["k"].values) == [0, 1, 2, 3]
    loss = ds["loss"]
    clean = _loss_without(cfg, model, data, [])
    assert float(ds["loss_clean"]) == pytest.approx(clean, abs=2e-6) and np.allclose(loss.sel(k=0), clean, atol=2e-6)
    singles = np.array([_loss_without(cfg, model, data, [l]) for l in range(L)])
    # skip_loss at k=1 removes the layer whose removal alone hurts least
    assert ds["removed"].sel(criterion="skip_loss", k=1).values.argmax() == singles.argmin()
    assert float(loss.sel(criterion="skip_loss", k=1)) == pytest.approx(singles.min(), abs=2e-6)
    for crit in ("angular_block", "block_influence", "skip_loss", "causal", "permutation"):
        for k in (1, 2, 3):
            mask = ds["removed"].sel(criterion=crit, k=k).values
            layers = np.flatnonzero(mask).tolist()
            assert mask.sum() == k and set(np.unique(mask)) <= {0.0, 1.0}
            assert float(loss.sel(criterion=crit, k=k)) == pytest.approx(
                _loss_without(cfg, model, data, layers), abs=2e-6
            )
            if crit == "angular_block":
                assert layers == list(range(layers[0], layers[0] + k))  # one contiguous window
    rnd = loss.sel(criterion="random").values[1:]
    assert (ds["loss_random_min"].values[1:] <= rnd + 1e-12).all() and (
        rnd <= ds["loss_random_max"].values[1:] + 1e-12
    ).all()
    assert np.allclose(ds["removed"].sel(criterion="random").sum("layer").values, [0, 1, 2, 3])
    # the permutation criterion removes the late layers whose swaps cost least, recounted from the matrix
    perm = permutation_scores(model, data, pairs="late").perm_abs.values
    late = range(L // 4, L)
    mean_swap = {l: np.mean([perm[l, j] for j in late if j != l]) for l in late}
    for k in (1, 2, 3):
        want = sorted(sorted(mean_swap, key=lambda l: (mean_swap[l], l))[:k])
        assert np.flatnonzero(ds["removed"].sel(criterion="permutation", k=k).values).tolist() == want
    det = loss.sel(criterion=["angular_block", "block_influence", "skip_loss", "causal", "permutation"])
    best = det["criterion"].values[det.values.argmin(0)]
    assert list(ds["best_criterion"].values[1:]) == list(best[1:])


def test_bad_options(setup):
    _, model, data = setup
    with pytest.raises(DepthlensError, match="k_max"):
        pruning_curves(model, data, k_max=L)
    with pytest.raises(DepthlensError, match="unknown pruning criteria"):
        pruning_curves(model, data, criteria=("magic",))


def test_curves_on_eval_data_that_records_its_seed(setup):
    """Loaded eval data carries its draw seed in the provenance; the random draws' seed is an option of its own."""
    import dataclasses

    _, model, data = setup
    ds = pruning_curves(model, dataclasses.replace(data, seed=7), k_max=1, n_random=2, seed=5, criteria=("random",))
    assert ds.attrs["seed"] == 7 and ds.attrs["random_seed"] == 5


def test_curves_build_no_autograd_graph(setup):
    """Every forward of the pruning curves runs without autograd: with it, each stored clean state kept its whole
    forward graph alive (a 0.5B model's stage grew past 17 GB), and nothing here needs a gradient."""
    cfg, model, data = setup
    grad_seen = []
    hooks = [b.register_forward_hook(lambda m, i, o: grad_seen.append(torch.is_grad_enabled())) for b in model.blocks]
    try:
        pruning_curves(model, data, k_max=2, n_random=1, seed=0)
    finally:
        for h in hooks:
            h.remove()
    assert grad_seen and not any(grad_seen)


def test_permutation_importance_scores_only_swapped_layers():
    """Mean of the computed off-diagonal swaps per layer; a layer in no computed pair is NaN (ranked last)."""
    import xarray as xr

    m = np.full((4, 4), np.nan)
    np.fill_diagonal(m, 0.0)
    m[1, 2] = m[2, 1] = 0.3
    m[1, 3] = m[3, 1] = 0.1
    score = permutation_importance(xr.Dataset({"perm_abs": (("i", "j"), m)}))
    np.testing.assert_allclose(score, [np.nan, 0.2, 0.3, 0.1])


def test_permutation_criterion_refuses_more_layers_than_it_scored(setup):
    _, model, data = setup
    perm = permutation_scores(model, data, pairs=[(4, 5)])  # two layers scored
    with pytest.raises(DepthlensError, match="scores 2 layers"):
        pruning_curves(model, data, k_max=3, criteria=("permutation",), permutation=perm)
    other = permutation_scores(build_model(ModelConfig.debug("preln", n_layer=4), seed=0).eval(), data)
    with pytest.raises(DepthlensError, match="has 4 layers; the model has 6"):
        pruning_curves(model, data, k_max=1, criteria=("permutation",), permutation=other)


def test_criteria_added_later_equal_one_run_with_them_all(setup):
    """A criterion whose diagnostic came later (the atlas's permutation stage) is merged into the curves
    already computed: the same numbers as one run with every criterion, and the best criterion recomputed."""
    _, model, data = setup
    crits = ("angular_block", "skip_loss", "permutation", "random")
    whole = pruning_curves(model, data, k_max=3, n_random=2, seed=1, criteria=crits)
    base = pruning_curves(model, data, k_max=3, n_random=2, seed=1, criteria=("angular_block", "skip_loss", "random"))
    extra = pruning_curves(model, data, k_max=3, criteria=("permutation",))
    assert np.isnan(extra["loss_random_min"].values[1:]).all()  # no draws: no band (and no warning)
    merged = add_criteria(base, extra)
    assert list(merged["criterion"].values) == ["angular_block", "skip_loss", "random", "permutation"]
    for c in crits:
        np.testing.assert_allclose(merged["loss"].sel(criterion=c), whole["loss"].sel(criterion=c), rtol=1e-12)
        np.testing.assert_array_equal(merged["removed"].sel(criterion=c), whole["removed"].sel(criterion=c))
    assert list(merged["best_criterion"].values) == list(whole["best_criterion"].values)
    assert merged.attrs["layers_run"] == base.attrs["layers_run"] + extra.attrs["layers_run"]
    assert add_criteria(merged, extra) is merged  # nothing new: unchanged
    other = pruning_curves(model, EvalData.from_tokens(data.tokens[:3]), k_max=3, criteria=("permutation",))
    with pytest.raises(DepthlensError, match="differ in"):
        add_criteria(base, other)


@pytest.mark.parametrize("design", ["preln", "hc", "mhc", "full_attnres", "block_attnres", "moda"])
def test_an_anchored_cut_is_bit_identical_and_runs_fewer_layers(design, monkeypatch):
    """A cut started from the anchor's states (where it agrees with the anchor below a layer) gives the very
    sums of the cut run from the clean states, on every kind of residual state (one stream, n streams, the
    depth-attention history), and runs fewer layers."""
    model = build_model(ModelConfig.debug(design, n_layer=6), seed=2).eval()
    data = EvalData.from_tokens(torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(5)))
    ran = [0]
    real = type(model).run_layers

    def counted(self, state, ctx, start=0, stop=None, **kw):
        ran[0] += (self.n_layer if stop is None else stop) - start
        return real(self, state, ctx, start, stop, **kw)

    with torch.no_grad():
        plain = _Pruner(model, data, batch_size=2)
        anchored = _Pruner(model, data, batch_size=2)
        monkeypatch.setattr(type(model), "run_layers", counted)
        for anchor, cuts in (([1], [[1, 3], [1, 5], [1, 2, 4], [0, 1]]), ([0, 2], [[0, 2, 4], [0, 2], [0, 3]])):
            anchored.anchor(anchor)
            for cut in cuts:
                ran[0] = 0
                want = plain.seq_sums(cut)
                fresh = ran[0]
                ran[0] = 0
                got = anchored.seq_sums(cut)
                assert got.tobytes() == want.tobytes(), (anchor, cut)
                if cut == cuts[1]:  # the anchor's states were built by the first cut: later ones only gain
                    assert ran[0] < fresh, (anchor, cut, ran[0], fresh)
        assert plain.forward_layers == anchored.forward_layers  # the cost record does not depend on the path

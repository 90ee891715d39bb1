"""Merging pruning results computed at different times (the real-model report adds a criterion computed later)
checks that both are the same measurement; that check must not depend on the machine (issue 35). Two runs of one
model on one data at another thread count differ in the last bits of every sum: they merge. Another model's losses
do not. The tolerance is the model dtype's (`diagnostics.pruning.same_losses`, the rule of
`models.protocol.same_logits`): it was rtol 1e-6 (add_criteria) and 1e-9 (merge_heldout), far below fp32 rounding
of a loss summed over thousands of tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.errors import DepthlensError

DOMAINS = ["english"] * 3 + ["code"] * 4


@pytest.fixture(scope="module")
def tiny():
    from depthlens.models import ModelConfig, build_model
    from depthlens.runtime.evaldata import EvalData

    model = build_model(ModelConfig.debug("preln", n_layer=5), seed=3).eval()
    data = EvalData.from_tokens(torch.randint(0, 97, (7, 16), generator=torch.Generator().manual_seed(0)))
    return model, data


def _nudged(ds, var, rel):
    out = ds.copy(deep=True)
    out[var] = out[var] * (1 + rel)
    return out


def test_pruning_curves_merge_across_last_bit_differences_only(tiny):
    from depthlens.diagnostics.pruning import add_criteria, pruning_curves

    model, data = tiny
    base = pruning_curves(model, data, k_max=2, criteria=("skip_loss",))
    extra = pruning_curves(model, data, k_max=2, criteria=("angular_block",))
    merged = add_criteria(base, _nudged(extra, "loss_clean", 5e-6))  # what another thread count does, and more
    assert "angular_block" in list(merged["criterion"].values)
    with pytest.raises(DepthlensError, match="clean loss"):
        add_criteria(base, _nudged(extra, "loss_clean", 1e-2))


def test_heldout_curves_merge_across_last_bit_differences_only(tiny):
    from depthlens.diagnostics.pruning_heldout import heldout_curves, merge_heldout

    model, data = tiny
    kw = dict(domains=DOMAINS, k_max=1, n_pool=2)
    base = heldout_curves(model, data, criteria=("skip_loss",), **kw)
    extra = heldout_curves(model, data, criteria=("angular_block",), **kw)
    assert base.attrs["dtype"] == "float32"
    merged = merge_heldout(base, _nudged(extra, "clean_seq", 1e-6))
    assert {"skip_loss", "angular_block"} <= set(merged["criterion"].values)
    with pytest.raises(DepthlensError, match="clean losses"):
        merge_heldout(base, _nudged(extra, "clean_seq", 1e-2))


def test_same_losses_is_the_dtypes_rounding():
    from depthlens.diagnostics.pruning import same_losses

    a = np.array([2.5, 3.1, 7.25])
    assert same_losses(a, a * (1 + 1e-5), "float32") and not same_losses(a, a * (1 + 1e-3), "float32")
    assert same_losses(a, a * (1 + 1e-3), "bfloat16") and not same_losses(a, a * (1 + 0.2), "bfloat16")
    assert not same_losses(a, np.array([2.5, np.nan, 7.25]), "float32")  # NaN never matches

"""Training robustness: every one of the ten designs resumes bit-exactly (parameters that get no gradient
included), a NaN/inf loss stops the run with one line naming the step and keeps the last good resume state,
and the documented torchrun launch lines parse under torchrun's own argument parser."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from depthlens.designs import SLUGS
from depthlens.training.trainer import train
from test_trainer import REPO, _weights, corpus, log_losses, tiny  # noqa: F401  (corpus is a fixture)

torch.set_num_threads(1)


def _design(corpus: Path, out: Path, arch: str, **kw):  # noqa: F811
    model = {**tiny(corpus, out).model, "arch": arch, "n_layer": 3}
    return tiny(corpus, out, steps=6, warmup=1, model=model, **kw)


@pytest.mark.parametrize("arch", SLUGS)
def test_every_design_resumes_bit_exactly(corpus, tmp_path, arch):  # noqa: F811
    """stop_after=3 then a rerun of the same command ends with the weights of an uninterrupted run, bit for
    bit; MoDA's last-layer depth K/V projections get no gradient (so no optimizer state) and must resume too."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_design(corpus, straight, arch))
    assert train(_design(corpus, resumed, arch, stop_after=3)) == {"step": 3, "stopped": True}
    train(_design(corpus, resumed, arch))
    ref, got = _weights(straight / "checkpoint"), _weights(resumed / "checkpoint")
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref), [k for k in ref if not torch.equal(got[k], ref[k])][:3]
    assert log_losses(resumed) == log_losses(straight)

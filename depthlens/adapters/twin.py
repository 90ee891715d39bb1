"""The untrained twin of a loaded model: the same config and tokenizer through the same adapter path, with
freshly initialised weights.

A diagnostic read on a trained model says something about training only beside the same reading on its
twin: much of a share (the causal max, Pre-LN's residual growth) is already set by the architecture at
initialisation. depthlens checkpoints get the trainer's exact step-0 weights for their training seed
(`build_model(config, seed)`); a foreign model gets its own family's initialisation (`type(hf)(config)`:
transformers' `_init_weights`, normal with the config's `initializer_range`), which is the init its makers
trained from up to their seed.
"""

from __future__ import annotations

from typing import Any

from ..errors import DepthlensError


def untrained_twin(model: Any, seed: int = 0) -> Any:
    """The model of `model`'s config at initialisation (seed `seed`), in eval mode, on its device and dtype.

    depthlens models: `build_model(config, seed)`; HF and GGUF models (`model.hf`): the HF class built from
    the same config under `torch.manual_seed(seed)` and wrapped like the original (hand-mapped or generic)."""
    import torch

    from ..models.config import ModelConfig

    p = next(model.parameters())
    cfg = getattr(model, "config", None)
    if isinstance(cfg, ModelConfig):
        from ..models.model import build_model

        return build_model(cfg, seed=seed).to(device=p.device, dtype=p.dtype).eval()
    hf = getattr(model, "hf", None)
    if hf is None:
        raise DepthlensError(f"no untrained twin for a {type(model).__name__}: neither a depthlens nor an HF model")
    from .hf import wrap

    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(seed)
        twin = type(hf)(hf.config)
    return wrap(twin.to(device=p.device, dtype=p.dtype).eval(), getattr(model, "tokenizer", None))

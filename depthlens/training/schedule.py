"""Learning-rate schedules as pure functions of the step (so a resumed run needs only the step).

`step` is the 0-based index of the optimizer step about to be taken; step `steps - 1` is the last.

* warmup (both): factor = (step + 1) / warmup for step < warmup, so the last warmup step reaches the peak.
* "wsd" (warmup-stable-decay, torchtitan): 1 until the last `decay_frac·steps` steps, then linear down to
  `min_lr_factor`, reached exactly on the last step.
* "cosine" (nanoGPT): half a cosine from 1 after warmup to `min_lr_factor` on the last step.
"""

from __future__ import annotations

import math


def lr_factor(
    step: int,
    steps: int,
    *,
    warmup: int = 0,
    schedule: str = "wsd",
    decay_frac: float = 0.2,
    min_lr_factor: float = 0.1,
) -> float:
    """Multiplier of the peak LR at `step` (0 <= step < steps)."""
    if not 0 <= step < steps:
        raise ValueError(f"step {step} outside [0, {steps})")
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "wsd":
        decay_steps = min(round(decay_frac * steps), steps - warmup)
        decay_start = steps - decay_steps
        if step < decay_start:
            return 1.0
        progress = (step - decay_start + 1) / decay_steps
        return 1.0 - (1.0 - min_lr_factor) * progress
    if schedule == "cosine":
        span = steps - warmup
        progress = (step - warmup + 1) / span
        return min_lr_factor + (1.0 - min_lr_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}; expected 'wsd' or 'cosine'")


def lr_at(step: int, cfg) -> float:
    """The learning rate of a RunConfig at `step`."""
    return cfg.lr * lr_factor(
        step,
        cfg.steps,
        warmup=cfg.warmup,
        schedule=cfg.schedule,
        decay_frac=cfg.decay_frac,
        min_lr_factor=cfg.min_lr_factor,
    )

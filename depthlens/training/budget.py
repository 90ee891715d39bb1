"""What a training run costs: model FLOPs per token (for MFU), the device's peak, and a memory estimate that
refuses up front a run that cannot fit (trainer.py calls `check_memory` before it allocates anything)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from .config import RunConfig
from .distributed import DistInfo

# Dense bf16 peak FLOP/s per device for MFU (torchtitan's table); None = no meaningful peak (CPU).
PEAK_FLOPS: dict[str, float | None] = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,
    "cpu": None,
}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return PEAK_FLOPS["cpu"]
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k != "cpu" and k in name), None)


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """6·N_matmul + 12·L·d·T (nanoGPT / torchtitan): every parameter but the input embedding table is
    a matmul weight (the LM head counts even when tied); attention adds 12·L·(H·d_h)·T, causality not discounted."""
    cfg: Any = model.config  # a DepthModel's ModelConfig (nn.Module's attribute type says Tensor | Module)
    n = sum(p.numel() for p in model.parameters())  # unique parameters: a tied table counts once
    n_matmul = n - cfg.vocab_size * cfg.d_model + (cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0)
    return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len


def train_bytes(cfg: RunConfig, micro: int, world: int = 1, device: str = "cpu") -> float:
    """A deliberately low estimate of one rank's training memory, so only runs that cannot fit are refused:
    fp32 weights + grads + AdamW moments (16 B per parameter, sharded under FSDP), plus what one micro-batch
    keeps for backward: >= 16·d per token and layer (2·n·d more for the n streams of HC/mHC), the logits
    (2·V per token), and on CPU the attention probabilities (H·T² per layer: the math attention path
    materialises them; CUDA's flash path does not)."""
    c = cfg.model_config().resolved()
    n = 12 * c.n_layer * c.d_model**2 + c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    state = 16.0 * n / (world if cfg.fsdp else 1)
    streams = c.hc_streams if c.arch in ("hc", "mhc") else 0
    elem = 2.0 if cfg.dtype == "bf16" else 4.0
    tokens = micro * cfg.seq_len
    acts = elem * tokens * ((16 + 2 * streams) * c.d_model * c.n_layer + 2 * c.vocab_size)
    attn = elem * micro * c.n_head * cfg.seq_len**2 * c.n_layer if device == "cpu" else 0.0
    return state + acts + attn


def device_bytes(device: torch.device) -> float | None:
    """Total memory of `device` (physical RAM for the CPU); None when unknown."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: RunConfig, micro: int, dist: DistInfo) -> None:
    """Refuse up front (one line) a run whose memory estimate exceeds the device: seq_len or global_batch of
    10^6 must fail here, not with an out-of-memory kill after minutes."""
    need, have = train_bytes(cfg, micro, dist.world, dist.device.type), device_bytes(dist.device)
    if have is not None and need > have:
        raise ValueError(
            f"run config: training needs at least {need / 2**30:,.1f} GiB per rank (micro_batch={micro}, "
            f"seq_len={cfg.seq_len}, model {cfg.model_config().n_layer}x{cfg.model_config().d_model}) but "
            f"{dist.device.type} memory is {have / 2**30:,.1f} GiB; lower micro_batch or seq_len"
        )

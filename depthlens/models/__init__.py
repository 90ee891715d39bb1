"""Models: config, shared backbone, residual designs, the hooked DepthModel."""

from .config import ModelConfig, even_block_starts, kimi_block_starts
from .model import Block, DepthModel, build_model

__all__ = ["ModelConfig", "DepthModel", "Block", "build_model", "kimi_block_starts", "even_block_starts"]

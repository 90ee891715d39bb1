"""Input/output: checkpoints (safetensors + JSON)."""

from .checkpoint import Checkpoint, load, read_config, save

__all__ = ["Checkpoint", "load", "save", "read_config"]

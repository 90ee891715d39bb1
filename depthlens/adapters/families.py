"""The adapter registry: every Hugging Face family depthlens reads, listed explicitly (no import side effects).

A new family is one module defining its `AdapterSpec` (docs/foreign-models.md) plus one entry in `SPECS`.
"""

from __future__ import annotations

from ..errors import CheckpointError
from .base import AdapterSpec
from .gpt2 import GPT2
from .llama import LLAMA, MISTRAL
from .qwen import QWEN2, QWEN3

SPECS: dict[str, AdapterSpec] = {t: s for s in (GPT2, LLAMA, MISTRAL, QWEN2, QWEN3) for t in s.model_types}


def supported_model_types() -> list[str]:
    return sorted(SPECS)


def spec_for(model_type: str | None) -> AdapterSpec:
    """The spec serving a config.json `model_type`; CheckpointError (one line) if none does."""
    if model_type not in SPECS:
        raise CheckpointError(
            f"model_type {model_type!r} has no depthlens adapter; supported: {', '.join(sorted(SPECS))}"
        )
    return SPECS[model_type]

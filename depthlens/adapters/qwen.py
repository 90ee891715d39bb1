"""Qwen2 and Qwen3: LLaMA module paths, plus tensors depthlens has no slot for.

Qwen2 has q/k/v biases and Qwen3 has per-head q/k RMSNorms; the adapter runs them (they live inside the
HF attention module), but `convert.import_llama` refuses them rather than drop weights silently.
Qwen tokenizers add no BOS (tokenizer.py records this).
"""

from __future__ import annotations

from dataclasses import replace

from .llama import LLAMA, LLAMA_KEYS

QWEN2_KEYS: dict[str, str | None] = {
    **LLAMA_KEYS,
    "model.layers.{}.self_attn.q_proj.bias": None,
    "model.layers.{}.self_attn.k_proj.bias": None,
    "model.layers.{}.self_attn.v_proj.bias": None,
}

QWEN3_KEYS: dict[str, str | None] = {
    **LLAMA_KEYS,
    "model.layers.{}.self_attn.q_norm.weight": None,
    "model.layers.{}.self_attn.k_norm.weight": None,
}

QWEN2 = replace(LLAMA, family="qwen2", model_types=("qwen2",), key_map=QWEN2_KEYS)
QWEN3 = replace(LLAMA, family="qwen3", model_types=("qwen3",), key_map=QWEN3_KEYS)

"""LLaMA and Mistral (`LlamaForCausalLM`, `MistralForCausalLM`): the depthlens backbone's own layout.

The key map is exact and complete, so these checkpoints import losslessly as depthlens `preln` models
(convert.py). Mistral differs only in its sliding window, which the wrapper takes from the HF config.
"""

from __future__ import annotations

from dataclasses import replace

from .base import AdapterSpec

# HF key -> depthlens key; `{}` is the layer index.
LLAMA_KEYS: dict[str, str | None] = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.layers.{}.input_layernorm.weight": "blocks.{}.attn.norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "blocks.{}.attn.fn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "blocks.{}.attn.fn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "blocks.{}.attn.fn.v_proj.weight",
    "model.layers.{}.self_attn.o_proj.weight": "blocks.{}.attn.fn.o_proj.weight",
    "model.layers.{}.post_attention_layernorm.weight": "blocks.{}.mlp.norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "blocks.{}.mlp.fn.gate_proj.weight",
    "model.layers.{}.mlp.up_proj.weight": "blocks.{}.mlp.fn.up_proj.weight",
    "model.layers.{}.mlp.down_proj.weight": "blocks.{}.mlp.fn.down_proj.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}

LLAMA = AdapterSpec(
    family="llama",
    model_types=("llama",),
    blocks="model.layers",
    embed="model.embed_tokens",
    final_norm="model.norm",
    lm_head="lm_head",
    attn_norm="input_layernorm",
    attn="self_attn",
    mlp_norm="post_attention_layernorm",
    mlp="mlp",
    rotary="model.rotary_emb",
    key_map=LLAMA_KEYS,
)

MISTRAL = replace(LLAMA, family="mistral", model_types=("mistral",))

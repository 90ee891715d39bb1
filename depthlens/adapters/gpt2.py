"""GPT-2 (`GPT2LMHeadModel`): Pre-LN with LayerNorm, learned absolute positions, GELU MLP, Conv1D linears.

Still one residual stream with two additive sublayers per block, so every diagnostic applies. The key
map is empty: GPT-2 has no depthlens counterpart (biased LayerNorms, no RoPE), so it is analysed through
the adapter only, never imported.
"""

from __future__ import annotations

from .base import AdapterSpec

GPT2 = AdapterSpec(
    family="gpt2",
    model_types=("gpt2",),
    blocks="transformer.h",
    embed="transformer.wte",
    final_norm="transformer.ln_f",
    lm_head="lm_head",
    attn_norm="ln_1",
    attn="attn",
    mlp_norm="ln_2",
    mlp="mlp",
    pos_embed="transformer.wpe",
)

"""A tiny llama.cpp GGUF file written with the `gguf` package from a tiny random HF LLaMA (no download).

The layout follows llama.cpp's `convert_hf_to_gguf.py` for LLaMA: tensor names `token_embd`, `blk.{i}.attn_q`,
..., `output_norm`, `output`; q/k rows permuted into llama.cpp's rotary layout (transformers undoes it);
a byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`: 256 byte symbols, a few merges, <s>/</s>).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ["<|endoftext|>", "<s>", "</s>"]  # GPT2Tokenizer adds <|endoftext|> when absent
MERGES = ["t h", "h e", "a t", "i n", "e r", "th e", "Ġ t", "Ġ a", "o n", "a n"]


def byte_vocab() -> list[str]:
    """Specials, the 256 byte symbols of GPT-2's byte-to-unicode map, then one token per merge."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return SPECIALS + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    hf: Any, path: str | Path, *, quant: str = "F32", tokenizer: bool = True, block_count: int | None = None
) -> Path:
    """Write `hf` (a LlamaForCausalLM with vocab_size == len(byte_vocab())) as a GGUF file.

    quant: "F32" | "F16" | "Q8_0" (the 2-D weight matrices; norms stay F32, as llama.cpp does).
    block_count: override the header's layer count (to test the size check).
    """
    import gguf

    c = hf.config
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(block_count if block_count is not None else c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(
        {
            "F32": gguf.LlamaFileType.ALL_F32,
            "F16": gguf.LlamaFileType.MOSTLY_F16,
            "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[quant]
    )
    if tokenizer:
        toks = byte_vocab()
        assert len(toks) == c.vocab_size, (len(toks), c.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(toks)
        w.add_token_types(
            [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(toks) - len(SPECIALS))
        )
        w.add_token_merges(MERGES)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}

    def put(name: str, a: np.ndarray) -> None:
        if a.ndim == 2 and quant == "F16":
            w.add_tensor(name, a.astype(np.float16))
        elif a.ndim == 2 and quant == "Q8_0":
            q = gguf.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a.astype(np.float32))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        put(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        put(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_llama(seed: int = 0, n_layer: int = 4, tie: bool = False) -> Any:
    """A random LlamaForCausalLM whose vocabulary is the tiny GGUF tokenizer's (len(byte_vocab()) ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(byte_vocab()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(cfg).eval()

"""Model configuration: one validated dataclass for the backbone and every residual design.

Every field says why it exists. Options the study left open ([inferred] or [DepthBench-unknown],
docs/concepts.md#inferences) are named
fields with the documented default, and they travel with every checkpoint and every result.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Ge, Gt, Lt

from ..designs import SLUGS
from ..schema import OneOf, build, check_dataclass, require

MHC_INITS = ("identity", "zero")
MODA_DEPTH_ROPE = ("unrotated", "rotate_ffn", "prerope_keys")
# Checkpoints written before a field existed load with the value they were trained with, not today's default.
LEGACY_DEFAULTS: dict[str, Any] = {"mhc_init": "zero"}

# per-field rules, read by the schema layer (depthlens.schema.mirror)
Pos = Annotated[int, Gt(0)]
PosFloat = Annotated[float, Gt(0)]


def kimi_block_starts(n_layer: int, n_blocks: int = 8) -> list[int]:
    """Block AttnRes boundaries by the Kimi K3 rule: S = ceil(L / n_blocks) layers per block.

    Returns the 0-based layer indices that start a block: [0, S, 2S, ...] < L (the last block may be
    partial, and for some L there are only 7 blocks, e.g. L = 20, 26, 28, 42).
    """
    size = math.ceil(n_layer / n_blocks)
    return list(range(0, n_layer, size))


def even_block_starts(n_layer: int, n_blocks: int = 8) -> list[int]:
    """The alternative exact-N partition: start_k = floor(k L / N), k = 0..N-1 (deduplicated)."""
    return sorted({(k * n_layer) // n_blocks for k in range(min(n_blocks, n_layer))})


@dataclass
class ModelConfig:
    """A LLaMA-like decoder (RMSNorm, RoPE, SwiGLU, MHA/GQA) with one of ten residual designs."""

    # --- backbone -------------------------------------------------------------------------------
    arch: Annotated[str, OneOf(*SLUGS)] = "preln"  # residual design slug (depthlens.designs.SLUGS)
    d_model: Pos = 64  # width d
    n_layer: Pos = 4  # number of layers L; each layer = attention sublayer + MLP sublayer
    n_head: Pos = 4  # query heads H_q; head_dim = d_model / n_head
    n_kv_head: Pos | None = None  # KV heads H_kv for GQA (None = n_head, plain MHA)
    vocab_size: Pos = 257  # tokenizer vocabulary (bytes + BOS by default, so CPU tests stay fast)
    d_ff: Pos | None = None  # SwiGLU hidden size (None = 8/3 d rounded up to ffn_multiple)
    ffn_multiple: Pos = 32  # rounding of the default d_ff
    max_seq_len: Pos = 256  # longest sequence the RoPE table and the eval path accept
    rope_theta: PosFloat = 10000.0  # RoPE base [DepthBench-unknown]
    norm_eps: Annotated[float, Gt(0), Lt(1)] = 1e-6  # RMSNorm epsilon [DepthBench-unknown]
    tie_embeddings: bool = False  # share W_E and W_U; the paper's parameter counts imply untied
    init_std: PosFloat = 0.02  # std of the normal init of every linear and the embedding

    # --- single-stream designs ------------------------------------------------------------------
    deepnorm_alpha: PosFloat | None = None  # skip weight; None = (2L)^(1/4) as in the DeepNet paper
    deepnorm_beta: PosFloat | None = None  # init gain; None = (8L)^(-1/4)
    deepnorm_final_norm: bool = True  # keep the backbone final norm (LLaMA port) vs none (torchscale)
    keel_alpha: PosFloat | None = None  # skip weight; None = 2L (number of sublayers), fixed

    # --- multi-stream designs (HC, mHC) ---------------------------------------------------------
    hc_streams: Pos = 4  # n parallel residual streams
    hc_dynamic: bool = True  # DHC (tanh-gated, input-dependent) vs static SHC
    hc_collapse: Annotated[str, OneOf("sum", "mean")] = (
        "sum"  # how the n streams become one at the end: sum (HC paper) | mean (Megatron)
    )
    mhc_sinkhorn_iters: Pos = 20  # t_max of the Sinkhorn-Knopp projection
    mhc_gating_init: float = 0.01  # initial alpha^{pre,post,res}
    mhc_init: Annotated[str, OneOf(*MHC_INITS)] = (
        "identity"  # static-bias init: "identity" (H_res ~ I, MindFormers) or "zero" (Megatron: H_res = J/n, rank-1 for good) [DepthBench-unknown]
    )
    multistream_skip: Annotated[str, OneOf("mix", "identity")] = (
        "mix"  # skip keeps the stream mixing and drops writes ("mix") or copies X_s ("identity") [inferred]
    )

    # --- cross-layer designs (AttnRes, MoDA) ----------------------------------------------------
    attnres_block_starts: list[Annotated[int, Ge(0)]] | None = (
        None  # Block AttnRes boundaries (layer indices); None = Kimi K3 rule
    )
    attnres_n_blocks: Pos = 8  # N used by the Kimi K3 rule S = ceil(L/N) when neither starts nor a size are given
    attnres_block_size: Pos | None = (
        None  # fixed S layers per block (Kimi's released config: 12); None = the ceil(L/N) rule [DepthBench-unknown]
    )
    attnres_skip: Annotated[str, OneOf("mask", "zero_value")] = (
        "mask"  # skip removes the sources from later softmaxes ("mask") or zeroes them ("zero_value") [inferred]
    )
    moda_depth_rope: Annotated[str, OneOf(*MODA_DEPTH_ROPE)] = (
        "unrotated"  # depth logits: un-rotated q,k ("unrotated"), k^F rotated at t ("rotate_ffn"), or rotated q against keys stored before RoPE ("prerope_keys", the official recipe) [inferred]
    )

    # ---------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        check_dataclass(self)  # types and per-field ranges (the annotations above), then the cross-field rules
        require(
            self.d_model % self.n_head == 0,
            "n_head",
            f"d_model={self.d_model} is not divisible by n_head={self.n_head}",
        )
        require(self.head_dim % 2 == 0, "n_head", f"head_dim={self.head_dim} must be even for RoPE")
        require(
            self.kv_heads <= self.n_head and self.n_head % self.kv_heads == 0,
            "n_kv_head",
            f"must divide n_head={self.n_head}, got {self.n_kv_head!r}",
        )
        if self.attnres_block_starts is not None:
            bs = self.attnres_block_starts
            require(
                len(bs) > 0 and bs[0] == 0 and all(a < b for a, b in zip(bs, bs[1:])) and bs[-1] < self.n_layer,
                "attnres_block_starts",
                f"must be strictly increasing layer indices starting at 0 and < n_layer, got {bs}",
            )

    # --- derived quantities ---------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        m = self.ffn_multiple
        return m * math.ceil(8 * self.d_model / 3 / m)

    @property
    def n_sublayer(self) -> int:
        return 2 * self.n_layer

    @property
    def block_starts(self) -> list[int]:
        """Block AttnRes boundaries actually used (explicit list or the Kimi K3 default)."""
        if self.attnres_block_starts is not None:
            return list(self.attnres_block_starts)
        if self.attnres_block_size is not None:
            return list(range(0, self.n_layer, self.attnres_block_size))
        return kimi_block_starts(self.n_layer, self.attnres_n_blocks)

    def resolved(self) -> ModelConfig:
        """A copy with every data-dependent default made explicit (what gets saved and recorded)."""
        c = dataclasses.replace(self)
        if c.d_ff is None:
            c.d_ff = self.ffn_dim
        if c.n_kv_head is None:
            c.n_kv_head = self.n_head
        if c.arch == "deepnorm":
            c.deepnorm_alpha = c.deepnorm_alpha or (2 * c.n_layer) ** 0.25
            c.deepnorm_beta = c.deepnorm_beta or (8 * c.n_layer) ** -0.25
        if c.arch == "keel" and c.keel_alpha is None:
            c.keel_alpha = float(2 * c.n_layer)
        if c.arch == "block_attnres" and c.attnres_block_starts is None:
            c.attnres_block_starts = self.block_starts
        return c

    # --- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: Any = "", *, prefix: str = "", usage_fields: Any = ()) -> ModelConfig:
        """From parsed JSON, through the schema layer: SchemaError (one line naming `where` and the field)."""
        return build(cls, d, where, prefix=prefix, usage_fields=usage_fields)

    @classmethod
    def debug(cls, arch: str = "preln", **kw: Any) -> ModelConfig:
        """A tiny config (torchtitan's "debugmodel") so every path runs on a CPU in tests."""
        base: dict[str, Any] = dict(arch=arch, d_model=32, n_layer=4, n_head=4, vocab_size=97, max_seq_len=64)
        base.update(kw)
        return cls(**base)

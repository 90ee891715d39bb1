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
from typing import Any

from ..designs import SLUGS

MHC_INITS = ("identity", "zero")
MODA_DEPTH_ROPE = ("unrotated", "rotate_ffn", "prerope_keys")
# Checkpoints written before a field existed load with the value they were trained with, not today's default.
LEGACY_DEFAULTS: dict[str, Any] = {"mhc_init": "zero"}


def check_fields(cls: type, d: Any, what: str) -> None:
    """Refuse keys that are not fields of dataclass `cls` (a typo must not silently become a default)."""
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"{what} has unknown field(s): {', '.join(unknown)}")


def _type_ok(v: Any, ann: str) -> bool:
    """Does `v` (parsed JSON) fit the annotation string `ann` (int, float, bool, str, list[int], X | None)?"""
    alts = [a.strip() for a in ann.split("|")]
    if v is None:
        return "None" in alts
    for a in alts:
        if a == "int" and isinstance(v, int) and not isinstance(v, bool):
            return True
        if a == "float" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return True
        if a == "bool" and isinstance(v, bool):
            return True
        if a == "str" and isinstance(v, str):
            return True
        if a == "list[int]" and isinstance(v, (list, tuple)) and all(_type_ok(x, "int") for x in v):
            return True
    return False


def check_types(obj: Any, what: str) -> None:
    """Refuse a field whose value has the wrong JSON type (`"hc_streams": 2.5`, `"n_layer": "4"`, `true`)."""
    for f in dataclasses.fields(obj):
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if any(t in ann for t in ("dict", "Any", "tuple")):
            continue
        v = getattr(obj, f.name)
        if not _type_ok(v, ann):
            raise ValueError(f"{what} {f.name!r}: must be {ann.replace(' | None', ' or null')}, got {v!r}")


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
    arch: str = "preln"  # residual design slug (depthlens.designs.SLUGS)
    d_model: int = 64  # width d
    n_layer: int = 4  # number of layers L; each layer = attention sublayer + MLP sublayer
    n_head: int = 4  # query heads H_q; head_dim = d_model / n_head
    n_kv_head: int | None = None  # KV heads H_kv for GQA (None = n_head, plain MHA)
    vocab_size: int = 257  # tokenizer vocabulary (bytes + BOS by default, so CPU tests stay fast)
    d_ff: int | None = None  # SwiGLU hidden size (None = 8/3 d rounded up to ffn_multiple)
    ffn_multiple: int = 32  # rounding of the default d_ff
    max_seq_len: int = 256  # longest sequence the RoPE table and the eval path accept
    rope_theta: float = 10000.0  # RoPE base [DepthBench-unknown]
    norm_eps: float = 1e-6  # RMSNorm epsilon [DepthBench-unknown]
    tie_embeddings: bool = False  # share W_E and W_U; the paper's parameter counts imply untied
    init_std: float = 0.02  # std of the normal init of every linear and the embedding

    # --- single-stream designs ------------------------------------------------------------------
    deepnorm_alpha: float | None = None  # skip weight; None = (2L)^(1/4) as in the DeepNet paper
    deepnorm_beta: float | None = None  # init gain; None = (8L)^(-1/4)
    deepnorm_final_norm: bool = True  # keep the backbone final norm (LLaMA port) vs none (torchscale)
    keel_alpha: float | None = None  # skip weight; None = 2L (number of sublayers), fixed

    # --- multi-stream designs (HC, mHC) ---------------------------------------------------------
    hc_streams: int = 4  # n parallel residual streams
    hc_dynamic: bool = True  # DHC (tanh-gated, input-dependent) vs static SHC
    hc_collapse: str = "sum"  # how the n streams become one at the end: sum (HC paper) | mean (Megatron)
    mhc_sinkhorn_iters: int = 20  # t_max of the Sinkhorn-Knopp projection
    mhc_gating_init: float = 0.01  # initial alpha^{pre,post,res}
    mhc_init: str = "identity"  # static-bias init: "identity" (H_res ~ I, MindFormers) or "zero" (Megatron: H_res = J/n, rank-1 for good) [DepthBench-unknown]
    multistream_skip: str = "mix"  # skip keeps the stream mixing and drops writes ("mix") or copies X_s ("identity") [inferred]

    # --- cross-layer designs (AttnRes, MoDA) ----------------------------------------------------
    attnres_block_starts: list[int] | None = None  # Block AttnRes boundaries (layer indices); None = Kimi K3 rule
    attnres_n_blocks: int = 8  # N used by the Kimi K3 rule S = ceil(L/N) when neither starts nor a size are given
    attnres_block_size: int | None = None  # fixed S layers per block (Kimi's released config: 12); None = the ceil(L/N) rule [DepthBench-unknown]
    attnres_skip: str = "mask"  # skip removes the sources from later softmaxes ("mask") or zeroes them ("zero_value") [inferred]
    moda_depth_rope: str = "unrotated"  # depth logits: un-rotated q,k ("unrotated"), k^F rotated at t ("rotate_ffn"), or rotated q against keys stored before RoPE ("prerope_keys", the official recipe) [inferred]

    # ---------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        def need(cond: bool, field_name: str, msg: str) -> None:
            if not cond:
                raise ValueError(f"config field {field_name!r}: {msg}")

        check_types(self, "config field")
        need(self.arch in SLUGS, "arch", f"unknown design {self.arch!r}; expected one of {', '.join(SLUGS)}")
        for name in ("d_model", "n_layer", "n_head", "vocab_size", "max_seq_len", "ffn_multiple"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, name, f"must be a positive int, got {v!r}")
        need(self.d_model % self.n_head == 0, "n_head", f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        need(self.head_dim % 2 == 0, "n_head", f"head_dim={self.head_dim} must be even for RoPE")
        kv = self.kv_heads
        need(isinstance(kv, int) and 0 < kv <= self.n_head and self.n_head % kv == 0, "n_kv_head",
             f"must divide n_head={self.n_head}, got {self.n_kv_head!r}")
        if self.d_ff is not None:
            need(isinstance(self.d_ff, int) and self.d_ff > 0, "d_ff", f"must be a positive int, got {self.d_ff!r}")
        need(self.rope_theta > 0 and math.isfinite(self.rope_theta), "rope_theta", "must be a positive finite number")
        need(0 < self.norm_eps < 1, "norm_eps", f"must be in (0, 1), got {self.norm_eps!r}")
        need(self.init_std > 0, "init_std", "must be positive")
        for name in ("deepnorm_alpha", "deepnorm_beta", "keel_alpha"):
            v = getattr(self, name)
            need(v is None or (v > 0 and math.isfinite(v)), name, f"must be positive, got {v!r}")
        need(self.hc_streams >= 1, "hc_streams", "must be >= 1")
        need(self.hc_collapse in ("sum", "mean"), "hc_collapse", "must be 'sum' or 'mean'")
        need(self.mhc_sinkhorn_iters >= 1, "mhc_sinkhorn_iters", "must be >= 1")
        need(self.moda_depth_rope in MODA_DEPTH_ROPE, "moda_depth_rope", f"must be one of {', '.join(MODA_DEPTH_ROPE)}")
        need(self.mhc_init in MHC_INITS, "mhc_init", f"must be one of {', '.join(MHC_INITS)}")
        need(self.attnres_block_size is None or (isinstance(self.attnres_block_size, int)
                                                 and not isinstance(self.attnres_block_size, bool)
                                                 and self.attnres_block_size >= 1),
             "attnres_block_size", f"must be a positive int or null, got {self.attnres_block_size!r}")
        need(self.multistream_skip in ("mix", "identity"), "multistream_skip", "must be 'mix' or 'identity'")
        need(self.attnres_skip in ("mask", "zero_value"), "attnres_skip", "must be 'mask' or 'zero_value'")
        need(self.attnres_n_blocks >= 1, "attnres_n_blocks", "must be >= 1")
        if self.attnres_block_starts is not None:
            bs = list(self.attnres_block_starts)
            need(len(bs) > 0 and bs[0] == 0 and all(a < b for a, b in zip(bs, bs[1:])) and bs[-1] < self.n_layer,
                 "attnres_block_starts", f"must be strictly increasing layer indices starting at 0 and < n_layer, got {bs}")
            self.attnres_block_starts = bs

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
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        check_fields(cls, d, "config")
        return cls(**d)

    @classmethod
    def debug(cls, arch: str = "preln", **kw: Any) -> ModelConfig:
        """A tiny config (torchtitan's "debugmodel") so every path runs on a CPU in tests."""
        base: dict[str, Any] = dict(arch=arch, d_model=32, n_layer=4, n_head=4, vocab_size=97, max_seq_len=64)
        base.update(kw)
        return cls(**base)


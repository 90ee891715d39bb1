"""Shape math for the LLaMA-like DepthBench models: parameter counts, iso-parameter width solver, FLOPs, KV cache.

Conventions (docs/training.md#shapes, docs/designs.md#overhead), no biases anywhere:

* attention per layer: Wq, Wo = 2·d² plus Wk, Wv = 2·d·(H_kv·d_h); MHA gives 4·d².
* SwiGLU MLP per layer (gate, up, down): 3·d·d_ff, with d_ff = 8/3·d *exactly* by default (so 8·d²),
  or 8/3·d rounded up to `ffn_multiple`, or an explicit `d_ff`.
* norms: 2·d per layer (two RMSNorm gains) + d for the final norm.
* embeddings: V·d input table, + V·d unembedding unless tied.
* per-design extra parameters vs Pre-LN from docs/designs.md#overhead (`design_overhead`).

Counts are exact Python ints. The solver works on a continuous width, then rounds to a multiple.
This module is pure Python (no torch) so the CLI and planning scripts import it instantly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from depthlens.designs import check_design

# Depths of the iso-parameter table of the paper's grid (docs/training.md#shapes) (the paper's sweep spans 16..70).
DEFAULT_DEPTHS: tuple[int, ...] = (12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 70)
GPT2_VOCAB = 50257  # GPT-2 BPE ids; the vocab that makes both paper endpoints ~400M (docs/training.md#shapes)


# ---------------------------------------------------------------------------------------------
# parameter counts


def design_overhead(
    design: str, n_layer: int, d_model: float, *, kv_dim: float | None = None, hc_streams: int = 4
) -> float:
    """Extra parameters of `design` over Pre-LN (docs/designs.md#overhead), for L layers of width d.

    `kv_dim` = H_kv·d_h (defaults to d, i.e. MHA); `hc_streams` = n for HC/mHC. Works on float widths
    too (the continuous solver uses it); `param_counts` passes ints and gets an int back.
    """
    L, d, n = n_layer, d_model, hc_streams
    kv = d if kv_dim is None else kv_dim
    overheads = {
        "preln": 0,
        "lns": 0,  # fixed 1/sqrt(l) constants only
        "sandwich": 2 * L * d,  # post-norm gains on both sublayers
        "deepnorm": 0,  # fixed alpha/beta; a "±d final norm" is not counted
        "keel": (2 * L - 1) * d,  # outer-norm gains
        "hc": 2 * L * (d * (n + 3) + n * n + 2 * n + 2),  # = 2L·(7d+26) for n=4
        "mhc": 2 * L * (n * d * (n * n + 2 * n) + (n * n + 2 * n) + 3),  # = 2L·(96d+27) for n=4
        "full_attnres": (4 * L + 2) * d,  # pseudo-query w and key-norm gain per sublayer + final
        "block_attnres": (4 * L + 2) * d,
        "moda": 2 * L * d * kv,  # FFN-side depth K/V projections
    }
    return overheads[check_design(design)]


def _ffn_dim(d_model: Any, d_ff: float | None, ffn_multiple: int | None) -> Any:
    """SwiGLU hidden width: explicit, 8/3·d rounded up to `ffn_multiple`, or exactly 8/3·d.

    For int d the exact default is a Fraction, so 3·d·d_ff stays an exact integer (8·d²).
    """
    if d_ff is not None:
        return d_ff
    exact = Fraction(8 * d_model, 3) if isinstance(d_model, int) else 8 * d_model / 3
    if ffn_multiple:
        return ffn_multiple * math.ceil(exact / ffn_multiple)
    return exact


def _raw_counts(
    design: str,
    n_layer: int,
    d_model: Any,
    vocab_size: int,
    *,
    d_ff: Any,
    kv_dim: Any,
    tie_embeddings: bool,
    hc_streams: int,
) -> dict[str, Any]:
    """Parameter groups for width `d_model` (int, Fraction or float): the one formula used everywhere."""
    L, d = n_layer, d_model
    attention = L * (2 * d * d + 2 * d * kv_dim)
    mlp = L * 3 * d * d_ff
    norms = 2 * L * d + d
    backbone = attention + mlp + norms  # the Pre-LN non-embedding count
    overhead = design_overhead(design, L, d, kv_dim=kv_dim, hc_streams=hc_streams)
    embedding = vocab_size * d * (1 if tie_embeddings else 2)
    return {
        "attention": attention,
        "mlp": mlp,
        "norms": norms,
        "backbone": backbone,
        "overhead": overhead,
        "non_embedding": backbone + overhead,
        "embedding": embedding,
        "total": backbone + overhead + embedding,
    }


def _heads(d_model: int, n_head: int | None, head_dim: int) -> tuple[int, int]:
    """(n_head, head_dim) with n_head·head_dim == d_model; `n_head` wins over `head_dim` when given."""
    if n_head is None:
        if d_model % head_dim:
            raise ValueError(f"d_model={d_model} is not a multiple of head_dim={head_dim}")
        return d_model // head_dim, head_dim
    if d_model % n_head:
        raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
    return n_head, d_model // n_head


def param_counts(
    design: str,
    n_layer: int,
    d_model: int,
    vocab_size: int,
    d_ff: float | None = None,
    n_head: int | None = None,
    n_kv_head: int | None = None,
    tie_embeddings: bool = False,
    head_dim: int = 64,
    hc_streams: int = 4,
    ffn_multiple: int | None = None,
) -> dict[str, Any]:
    """Exact parameter counts of one model, grouped, plus the resolved shape.

    Keys: `total`, `embedding` (V·d, ×2 if untied), `non_embedding` (= `backbone` + `overhead`),
    `backbone` (Pre-LN non-embedding: `attention` + `mlp` + `norms`), `overhead` (design extra vs Pre-LN),
    `lm_head` (V·d; counted as matmul FLOPs whether tied or not), and the shape: `design`, `n_layer`,
    `d_model`, `n_head`, `n_kv_head`, `head_dim`, `d_ff` (float; 8/3·d exactly by default), `vocab_size`,
    `tie_embeddings`, `hc_streams`.
    """
    n_head, head_dim = _heads(d_model, n_head, head_dim)
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if n_head % n_kv_head:
        raise ValueError(f"n_head={n_head} is not a multiple of n_kv_head={n_kv_head}")
    ffn = _ffn_dim(d_model, d_ff, ffn_multiple)
    raw = _raw_counts(
        design,
        n_layer,
        d_model,
        vocab_size,
        d_ff=ffn,
        kv_dim=n_kv_head * head_dim,
        tie_embeddings=tie_embeddings,
        hc_streams=hc_streams,
    )
    counts: dict[str, Any] = {k: int(round(v)) for k, v in raw.items()}  # exact already unless an odd explicit d_ff
    counts.update(
        lm_head=vocab_size * d_model,
        design=design,
        n_layer=n_layer,
        d_model=d_model,
        n_head=n_head,
        n_kv_head=n_kv_head,
        head_dim=head_dim,
        d_ff=float(ffn),
        vocab_size=vocab_size,
        tie_embeddings=tie_embeddings,
        hc_streams=hc_streams,
    )
    return counts


# ---------------------------------------------------------------------------------------------
# FLOPs and memory (inputs: a `param_counts` dict)


def train_flops_per_token(counts: dict[str, Any], seq_len: int) -> float:
    """Training FLOPs per token: 6·(N_ne + V·d) + 12·L·(H·d_h)·T.

    Matmul params include the LM head whether tied or not; causal masking is not discounted
    (torchtitan / nanoGPT MFU convention, docs/training.md#shapes).
    """
    attn_width = counts["n_head"] * counts["head_dim"]
    return 6.0 * (counts["non_embedding"] + counts["lm_head"]) + 12.0 * counts["n_layer"] * attn_width * seq_len


def prefill_flops(counts: dict[str, Any], seq_len: int, *, causal: bool = True, lm_head: bool = False) -> float:
    """Forward FLOPs for one sequence of T tokens: 2·N_ne·T + 2·L·T²·(H·d_h) causal (4·… if full),
    plus 2·V·d·T if the LM head runs on every position (docs/training.md#shapes)."""
    T = seq_len
    attn_width = counts["n_head"] * counts["head_dim"]
    flops = 2.0 * counts["non_embedding"] * T + (2.0 if causal else 4.0) * counts["n_layer"] * T * T * attn_width
    if lm_head:
        flops += 2.0 * counts["lm_head"] * T
    return flops


def kv_cache_bytes(counts: dict[str, Any], seq_len: int, bytes_per_element: int = 2) -> int:
    """KV-cache bytes for one sequence: 2 (K and V) · L · H_kv · d_h · T · bytes (2 = bf16)."""
    return 2 * counts["n_layer"] * counts["n_kv_head"] * counts["head_dim"] * seq_len * bytes_per_element


# ---------------------------------------------------------------------------------------------
# iso-parameter solver


def solve_width_continuous(
    target_params: float,
    n_layer: int,
    design: str = "preln",
    vocab_size: int = GPT2_VOCAB,
    *,
    d_ff: float | None = None,
    n_kv_head: int | None = None,
    head_dim: int = 64,
    tie_embeddings: bool = False,
    hc_streams: int = 4,
    ffn_multiple: int | None = None,
) -> float:
    """Real width d with total params == target (bisection; total is non-decreasing in d).

    With `n_kv_head` given, the K/V width H_kv·d_h stays fixed as d varies (GQA); otherwise MHA.
    """
    check_design(design)

    def total(d: float) -> float:
        kv_dim = d if n_kv_head is None else n_kv_head * head_dim
        return _raw_counts(
            design,
            n_layer,
            d,
            vocab_size,
            d_ff=_ffn_dim(d, d_ff, ffn_multiple),
            kv_dim=kv_dim,
            tie_embeddings=tie_embeddings,
            hc_streams=hc_streams,
        )["total"]

    lo, hi = 0.0, 1.0
    while total(hi) < target_params:
        lo, hi = hi, hi * 2
    for _ in range(100):  # 2^-100 relative: far below the rounding to `multiple`
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < target_params else (lo, mid)
    return (lo + hi) / 2


def solve_width(
    target_params: float,
    n_layer: int,
    design: str = "preln",
    vocab_size: int = GPT2_VOCAB,
    multiple: int = 64,
    **shape_kw: Any,
) -> int:
    """Width d for `n_layer` layers whose total params are nearest `target_params`, as the continuous
    solution rounded to the nearest multiple of `multiple` (at least `multiple`).

    `shape_kw` are the keyword options of `solve_width_continuous` (d_ff, n_kv_head, head_dim,
    tie_embeddings, hc_streams, ffn_multiple). Example (CPU zoo): target 0.5M, vocab_size=4096,
    multiple=32, head_dim=32.
    """
    head_dim = shape_kw.get("head_dim", 64)
    if multiple % head_dim:
        raise ValueError(f"multiple={multiple} must be a multiple of head_dim={head_dim}")
    d = solve_width_continuous(target_params, n_layer, design, vocab_size, **shape_kw)
    return max(multiple, multiple * math.floor(d / multiple + 0.5))


@dataclass(frozen=True)
class ShapeRow:
    """One row of an iso-parameter sweep: the shape, its counts, and its compute/memory cost."""

    design: str
    n_layer: int  # L
    d_model: int  # d, a multiple of the solver's `multiple`
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: float  # 8/3·d exactly unless rounded; float so the exact ratio is visible
    d_continuous: float  # unrounded solver width: shows how far rounding moved d
    target: int  # requested total params
    total: int
    non_embedding: int  # backbone + design overhead
    embedding: int
    overhead: int  # design extra params vs Pre-LN
    seq_len: int  # training context T for the FLOPs/token column
    train_flops_per_token: float  # 6·(N_ne + V·d) + 12·L·d·T
    prefill_len: int  # inference context for the prefill and KV columns
    prefill_flops: float  # per sequence, causal, without the LM head
    kv_cache_bytes: int  # per sequence

    @property
    def L(self) -> int:
        return self.n_layer

    @property
    def d(self) -> int:
        return self.d_model

    @property
    def heads(self) -> int:
        return self.n_head

    @property
    def aspect_ratio(self) -> float:
        """d / L: the paper's aspect ratio (76.0 for 16×1216, 9.1 for 70×640)."""
        return self.d_model / self.n_layer

    @property
    def rel_error(self) -> float:
        """total / target − 1: the error the width rounding leaves."""
        return self.total / self.target - 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of all fields plus `aspect_ratio` and `rel_error`."""
        return {**asdict(self), "aspect_ratio": self.aspect_ratio, "rel_error": self.rel_error}


def shape_row(
    target: float,
    n_layer: int,
    d_model: int,
    *,
    design: str = "preln",
    vocab_size: int = GPT2_VOCAB,
    d_continuous: float | None = None,
    seq_len: int = 2048,
    prefill_len: int = 4096,
    kv_bytes: int = 2,
    **shape_kw: Any,
) -> ShapeRow:
    """Build the `ShapeRow` of a given (L, d); `shape_kw` are `param_counts` keyword options."""
    c = param_counts(design, n_layer, d_model, vocab_size, **shape_kw)
    return ShapeRow(
        design=design,
        n_layer=n_layer,
        d_model=d_model,
        n_head=c["n_head"],
        n_kv_head=c["n_kv_head"],
        head_dim=c["head_dim"],
        d_ff=c["d_ff"],
        d_continuous=float(d_model if d_continuous is None else d_continuous),
        target=int(target),
        total=c["total"],
        non_embedding=c["non_embedding"],
        embedding=c["embedding"],
        overhead=c["overhead"],
        seq_len=seq_len,
        train_flops_per_token=train_flops_per_token(c, seq_len),
        prefill_len=prefill_len,
        prefill_flops=prefill_flops(c, prefill_len),
        kv_cache_bytes=kv_cache_bytes(c, prefill_len, kv_bytes),
    )


def _solved_row(
    target: float,
    n_layer: int,
    design: str,
    vocab_size: int,
    multiple: int,
    row_kw: dict[str, Any],
    shape_kw: dict[str, Any],
) -> ShapeRow:
    """Solve the width for one depth and build its row."""
    d_c = solve_width_continuous(target, n_layer, design, vocab_size, **shape_kw)
    d = solve_width(target, n_layer, design, vocab_size, multiple, **shape_kw)
    return shape_row(target, n_layer, d, design=design, vocab_size=vocab_size, d_continuous=d_c, **row_kw, **shape_kw)


def plan(
    target: float,
    depths: Sequence[int] | None = None,
    aspect_ratios: Sequence[float] | None = None,
    *,
    design: str = "preln",
    vocab_size: int = GPT2_VOCAB,
    multiple: int = 64,
    seq_len: int = 2048,
    prefill_len: int = 4096,
    kv_bytes: int = 2,
    max_layers: int = 128,
    ar_weight: float = 1.0,
    **shape_kw: Any,
) -> list[ShapeRow]:
    """Iso-parameter sweep at `target` total params, one row per depth or per target aspect ratio.

    * `depths`: solve d for each L (default: the depths of the paper's grid).
    * `aspect_ratios`: for each AR*, scan L in 1..`max_layers` (width solved per L) and keep the row
      minimising |N/N* − 1| + `ar_weight`·|log(AR/AR*)| (docs/training.md#shapes, "search (L, d) jointly").

    `shape_kw` go to `param_counts` / the solver (d_ff, n_kv_head, head_dim, tie_embeddings, hc_streams,
    ffn_multiple). FLOPs/token use `seq_len`; prefill FLOPs and KV bytes use `prefill_len`.
    """
    if depths is not None and aspect_ratios is not None:
        raise ValueError("give depths or aspect_ratios, not both")
    row_kw = dict(seq_len=seq_len, prefill_len=prefill_len, kv_bytes=kv_bytes)
    if aspect_ratios is None:
        return [
            _solved_row(target, L, design, vocab_size, multiple, row_kw, shape_kw)
            for L in (DEFAULT_DEPTHS if depths is None else depths)
        ]
    candidates = [
        _solved_row(target, L, design, vocab_size, multiple, row_kw, shape_kw) for L in range(1, max_layers + 1)
    ]

    def score(row: ShapeRow, ar: float) -> float:
        return abs(row.rel_error) + ar_weight * abs(math.log(row.aspect_ratio / ar))

    lo, hi = min(r.aspect_ratio for r in candidates), max(r.aspect_ratio for r in candidates)
    for ar in aspect_ratios:  # refused, not clamped to the nearest end: the row would not be the asked shape
        if not lo / 2 <= ar <= hi * 2:
            raise ValueError(
                f"--aspect-ratios {ar:g}: at this target the depths 1..{max_layers} give d/L in "
                f"[{lo:.3g}, {hi:.3g}]; ask for a ratio within a factor 2 of that range"
            )
    return [min(candidates, key=lambda row: score(row, ar)) for ar in aspect_ratios]

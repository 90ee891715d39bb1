"""Shape planner vs the hand-derived numbers of docs/training.md#shapes and the overhead table of
docs/designs.md#overhead.

Expected values are hand-derived (docs/training.md#shapes) or closed forms written out here, never the
planner's own output.
"""

import json
import math

import pytest

from depthlens.training.shapes import (
    kv_cache_bytes,
    param_counts,
    plan,
    prefill_flops,
    solve_width,
    solve_width_continuous,
    train_flops_per_token,
)

V = 50257  # GPT-2 vocab, untied (docs/training.md#shapes)
TARGET = 407e6

# the paper's iso-parameter grid: L -> (d continuous, d, heads, N_ne [M], N_total [M])
TABLE_2_3 = {
    12: (1368.0, 1344, 21, 260.1, 395.2),
    16: (1217.5, 1216, 19, 283.9, 406.2),
    20: (1109.5, 1088, 17, 284.1, 393.5),
    32: (906.8, 896, 14, 308.3, 398.4),
    40: (822.0, 832, 13, 332.3, 416.0),
    64: (665.4, 640, 10, 314.7, 379.0),
    70: (638.7, 640, 10, 344.2, 408.5),
}


def closed_form_total(L, d, vocab=V, tied=False):
    """12·L·d² + 2·L·d + d + (1 or 2)·V·d: MHA + SwiGLU at exactly 8/3·d, norms, embeddings."""
    return 12 * L * d * d + 2 * L * d + d + (1 if tied else 2) * vocab * d


@pytest.mark.parametrize("L,d", [(16, 1216), (70, 640), (4, 128)])
def test_param_counts_match_closed_form(L, d):
    c = param_counts("preln", L, d, V)
    assert c["total"] == closed_form_total(L, d)
    assert c["embedding"] == 2 * V * d
    assert c["non_embedding"] == 12 * L * d * d + 2 * L * d + d
    assert c["overhead"] == 0
    assert c["n_head"] == d // 64 and c["head_dim"] == 64
    assert c["d_ff"] == pytest.approx(8 * d / 3)


def test_paper_endpoints():
    assert param_counts("preln", 16, 1216, V)["total"] == 406_167_104  # 406.2M
    assert param_counts("preln", 70, 640, V)["total"] == 408_483_200  # 408.5M
    assert solve_width(TARGET, 16) == 1216
    assert solve_width(TARGET, 70) == 640


@pytest.mark.parametrize("L", sorted(TABLE_2_3))
def test_iso_parameter_table_rows(L):
    d_cont, d, heads, n_ne_m, total_m = TABLE_2_3[L]
    assert solve_width_continuous(TARGET, L) == pytest.approx(d_cont, abs=0.05)
    (row,) = plan(TARGET, depths=[L])
    assert (row.n_layer, row.d_model, row.n_head) == (L, d, heads)
    assert row.non_embedding / 1e6 == pytest.approx(n_ne_m, abs=0.05)
    assert row.total / 1e6 == pytest.approx(total_m, abs=0.05)
    assert row.aspect_ratio == pytest.approx(d / L)
    assert row.rel_error == pytest.approx(total_m / 407 - 1, abs=2e-4)


def test_default_plan_covers_spec_depths():
    rows = plan(TARGET)
    assert [r.L for r in rows] == [12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 70]
    assert {r.L: r.d for r in rows}[24] == 1024 and {r.L: r.d for r in rows}[48] == 768


@pytest.mark.parametrize(
    "ffn_multiple,vocab,tied,totals_m",
    [
        (64, V, False, (407.4, 411.4)),
        (256, V, False, (411.1, 420.0)),
        (None, V, True, (345.1, 376.3)),
        (None, 32000, False, (361.8, 385.1)),
        (None, 49152, False, (403.5, 407.1)),
    ],
)
def test_spec_table_2_2_variants(ffn_multiple, vocab, tied, totals_m):
    for (L, d), want in zip([(16, 1216), (70, 640)], totals_m, strict=True):
        c = param_counts("preln", L, d, vocab, tie_embeddings=tied, ffn_multiple=ffn_multiple)
        assert c["total"] / 1e6 == pytest.approx(want, abs=0.05)


def test_ffn_rounding_up():
    assert param_counts("preln", 16, 1216, V, ffn_multiple=256)["d_ff"] == 3328
    assert param_counts("preln", 70, 640, V, ffn_multiple=256)["d_ff"] == 1792
    assert param_counts("preln", 70, 640, V, ffn_multiple=64)["d_ff"] == 1728


def test_prefill_flops_at_4096():
    T = 4096
    want = {None: (2.98, 4.32), 256: (3.02, 4.42)}
    for mult, (shallow, deep) in want.items():
        a = prefill_flops(param_counts("preln", 16, 1216, V, ffn_multiple=mult), T)
        b = prefill_flops(param_counts("preln", 70, 640, V, ffn_multiple=mult), T)
        assert (round(a / 1e12, 2), round(b / 1e12, 2)) == (shallow, deep)
    # causal attention term alone: 2·L·T²·d (0.653 T and 1.503 T at T = 4096)
    c = param_counts("preln", 16, 1216, V)
    assert prefill_flops(c, T) - 2 * c["non_embedding"] * T == 2 * 16 * T * T * 1216
    # with the LM head: 3.48 T; full attention: 3.63 T
    assert prefill_flops(c, T, lm_head=True) / 1e12 == pytest.approx(3.48, abs=0.005)
    assert prefill_flops(c, T, causal=False) / 1e12 == pytest.approx(3.63, abs=0.005)


def test_kv_cache_bf16_at_4096():
    a = kv_cache_bytes(param_counts("preln", 16, 1216, V), 4096)
    b = kv_cache_bytes(param_counts("preln", 70, 640, V), 4096)
    assert round(a / 1e6, 1) == 318.8 and round(b / 1e6, 1) == 734.0
    assert a == 2 * 16 * 1216 * 4096 * 2
    assert b / a == pytest.approx(2.30, abs=0.005)


def test_train_flops_per_token():
    # docs/training.md#shapes: 6N + 12·L·d·T at T=2048 -> 2.55 G (16×1216) and 3.36 G (70×640)
    a = train_flops_per_token(param_counts("preln", 16, 1216, V), 2048)
    b = train_flops_per_token(param_counts("preln", 70, 640, V), 2048)
    assert (round(a / 1e9, 2), round(b / 1e9, 2)) == (2.55, 3.36)
    c = param_counts("preln", 16, 1216, V)
    assert a == 6 * (c["non_embedding"] + V * 1216) + 12 * 16 * 1216 * 2048


@pytest.mark.parametrize(
    "design,overhead",
    [
        ("preln", lambda L, d: 0),
        ("lns", lambda L, d: 0),
        ("deepnorm", lambda L, d: 0),
        ("sandwich", lambda L, d: 2 * L * d),
        ("keel", lambda L, d: (2 * L - 1) * d),
        ("hc", lambda L, d: 2 * L * (7 * d + 26)),
        ("mhc", lambda L, d: 2 * L * (96 * d + 27)),
        ("full_attnres", lambda L, d: (4 * L + 2) * d),
        ("block_attnres", lambda L, d: (4 * L + 2) * d),
        ("moda", lambda L, d: 2 * L * d * d),
    ],
)
def test_design_overheads_match_architectures_table(design, overhead):
    L, d = 6, 256
    base = param_counts("preln", L, d, 4096)
    c = param_counts(design, L, d, 4096)
    assert c["overhead"] == overhead(L, d)
    assert c["total"] == base["total"] + overhead(L, d)
    assert c["non_embedding"] == base["non_embedding"] + overhead(L, d)


def test_gqa_attention_and_kv_cache():
    L, d, h, kv = 4, 512, 8, 2
    mha = param_counts("preln", L, d, 1000)
    gqa = param_counts("preln", L, d, 1000, n_kv_head=kv)
    # attention 2d²(1 + h_kv/h) per layer instead of 4d²
    assert mha["total"] - gqa["total"] == L * (4 * d * d - 2 * d * d * (1 + kv / h))
    assert kv_cache_bytes(gqa, 100) == 2 * L * kv * 64 * 100 * 2
    assert param_counts("moda", L, d, 1000, n_kv_head=kv)["overhead"] == 2 * L * d * kv * 64


def test_hc_stream_count():
    n, L, d = 2, 3, 64
    assert param_counts("hc", L, d, 100, hc_streams=n)["overhead"] == 2 * L * (d * (n + 3) + n * n + 2 * n + 2)


def test_tiny_cpu_solve():
    for L in (2, 4, 6):
        d = solve_width(0.5e6, L, vocab_size=4096, multiple=32, head_dim=32)
        assert d % 32 == 0 and d >= 32
        c = param_counts("preln", L, d, 4096, head_dim=32)
        assert c["n_head"] == d // 32
        # rounding to the nearest multiple of 32 moves the total by less than one width step
        up = closed_form_total(L, d + 32, vocab=4096)
        down = closed_form_total(L, max(d - 32, 1), vocab=4096)
        assert down <= 0.5e6 <= up or d == 32


def test_plan_by_aspect_ratio_finds_paper_endpoints():
    rows = plan(TARGET, aspect_ratios=[76.0, 9.1])
    assert [(r.L, r.d) for r in rows] == [(16, 1216), (70, 640)]


def test_row_to_dict_is_json():
    (row,) = plan(TARGET, depths=[16])
    d = json.loads(json.dumps(row.to_dict()))
    assert d["n_layer"] == 16 and d["d_model"] == 1216 and d["aspect_ratio"] == 76.0
    assert math.isclose(d["prefill_flops"], row.prefill_flops)
    assert (row.L, row.d, row.heads) == (16, 1216, 19)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown design"):
        param_counts("postln", 2, 128, 100)
    with pytest.raises(ValueError, match="head_dim"):
        param_counts("preln", 2, 100, 100)
    with pytest.raises(ValueError, match="multiple"):
        solve_width(1e6, 2, multiple=32)  # head_dim 64 does not divide 32
    with pytest.raises(ValueError, match="not both"):
        plan(TARGET, depths=[16], aspect_ratios=[76])

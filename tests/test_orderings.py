"""The report's DepthBench-claim verdicts on hand-made records: every verdict from an interval (seeds pooled
by t intervals, one seed by the paired interval over sequences), and the same check at init."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from depthlens.stats.orderings import CLAIMS, Claim, check, check_all, markdown


def rec(design, L, seed=0, share=None, lo=None, hi=None, loss=None, erank=None, dead=None, **kw):
    return {
        "design": design,
        "n_layer": L,
        "seed": seed,
        "causal_share": share,
        "causal_ci_low": lo,
        "causal_ci_high": hi,
        "causal_ci_method": "m",
        "eval_loss": loss,
        "erank_full": erank,
        "dead_prefix": dead,
        **kw,
    }


def cmp(seed, diff, low, high, untrained=None):
    row = {
        "score": "causal",
        "higher": "hc",
        "lower": "preln",
        "L": 32,
        "seed": seed,
        "diff": diff,
        "low": low,
        "high": high,
        "method": "paired jackknife",
        "unit": "eval sequences",
    }
    if untrained is not None:
        row.update(
            untrained_diff=untrained[0],
            untrained_low=untrained[1],
            untrained_high=untrained[2],
            untrained_method="paired jackknife",
            untrained_unit="eval sequences",
        )
    return row


C = Claim("order", "causal", "hc", "preln", 32, "x")


def test_one_seed_uses_the_paired_sequence_interval_and_says_so():
    recs = [rec("hc", 32, share=0.7), rec("preln", 32, share=0.5)]
    r = check(C, recs, [cmp(0, 0.2, 0.1, 0.3, untrained=(0.2, 0.15, 0.25))])
    assert r["verdict"] == "holds" and "excludes training variance" in r["note"]
    assert r["verdict_untrained"] == "holds" and r["seeds"] == [0]
    assert check(C, recs, [cmp(0, -0.2, -0.3, -0.1)])["verdict"] == "reversed"
    assert check(C, recs, [cmp(0, 0.05, -0.1, 0.2)])["verdict"] == "unresolved"
    assert check(C, [rec("hc", 32, share=0.7)])["verdict"] == "no data"


def test_seeds_pool_by_a_t_interval_over_paired_differences():
    diffs = [0.2, 0.25, -0.05]
    rows = [cmp(s, d, d - 0.01, d + 0.01) for s, d in enumerate(diffs)]
    recs = [rec(d, 32, seed=s, share=0.5) for d in ("hc", "preln") for s in range(3)]
    r = check(C, recs, rows)
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert r["interval"]["low"] == pytest.approx(lo) and r["interval"]["high"] == pytest.approx(hi)
    assert r["verdict"] == "unresolved" and r["note"] is None and r["interval"]["unit"] == "training seeds"
    assert r["n_runs"] == [3, 3]


def test_loss_signs_erank_and_dead_prefix():
    hc_gain = Claim("sign", "loss_change", "hc", None, 32, "x", sign=-1)
    recs = [rec("hc", 16, seed=s, loss=2.10 + 0.01 * s) for s in range(3)] + [
        rec("hc", 32, seed=s, loss=2.00 + 0.01 * s) for s in range(3)
    ]
    r = check(hc_gain, recs)
    assert r["verdict"] == "holds" and r["interval"]["high"] < 0  # the loss falls: an improvement
    assert check(Claim("sign", "loss_change", "hc", None, 32, "x", sign=1), recs)["verdict"] == "reversed"
    one = [rec("hc", 16, loss=2.1), rec("hc", 32, loss=2.0)]  # one seed, no paired row: no interval
    assert check(hc_gain, one)["verdict"] == "unresolved"
    er = Claim("order", "erank_full", "hc", "mhc", 32, "x")
    recs = [rec("hc", 32, seed=s, erank=1.0 + 1e-3 * s, erank_full_untrained=4.0) for s in range(3)] + [
        rec("mhc", 32, seed=s, erank=3.6 + 0.05 * s, erank_full_untrained=2.8 + 0.01 * s) for s in range(3)
    ]
    r = check(er, recs)
    assert r["verdict"] == "reversed" and r["verdict_untrained"] == "holds"
    dead = Claim("at_least", "dead_prefix", "block_attnres", None, 32, "x", bound=1.0)
    r = check(dead, [rec("block_attnres", 32, seed=s, dead=0) for s in range(3)])
    assert r["verdict"] == "absent" and "zero-width" in r["note"]  # k* = 0 in every run: absent, not its opposite
    r = check(dead, [rec("block_attnres", 32, seed=s, dead=0, dead_prefix_untrained=0) for s in range(3)])
    assert r["verdict"] == "absent, as at init" and r["verdict_untrained"] == "absent"
    assert check(dead, [rec("block_attnres", 32, seed=s, dead=8 + s) for s in range(3)])["verdict"] == "holds"
    assert check(dead, [rec("block_attnres", 32, dead=8)])["verdict"] == "unresolved"  # one seed: no interval


def test_markdown_counts_every_claim():
    res = check_all([])
    text = markdown(res)
    assert text.count("| no data |") == 2 * len(res) == 2 * len(CLAIMS) and f"of {len(res)} claims" in text
    assert "ranking robustness" not in text.lower()

"""The report's DepthBench-ordering verdicts on hand-made records (every verdict branch)."""

from __future__ import annotations

from depthlens.stats.orderings import Claim, check, check_all, markdown


def rec(design, L, share=None, lo=None, hi=None, val=None, erank=None):
    return {"design": design, "n_layer": L, "causal_share": share, "causal_ci_low": lo, "causal_ci_high": hi,
            "val_loss": val, "erank_full": erank}


def test_verdicts():
    c = Claim("causal", "hc", "preln", 32, "x")
    assert check(c, [rec("hc", 32, .3, .2, .4), rec("preln", 32, .05, 0, .1)])["verdict"] == "holds"
    assert check(c, [rec("hc", 32, .05, 0, .1), rec("preln", 32, .3, .2, .4)])["verdict"] == "reversed"
    assert check(c, [rec("hc", 32, .3, .1, .4), rec("preln", 32, .2, .05, .25)])["verdict"] == "unresolved (CIs overlap)"
    assert check(c, [rec("hc", 32, .3, .1, .4)])["verdict"] == "no data"
    e = Claim("erank_full", "hc", "mhc", 32, "x")
    assert check(e, [rec("hc", 32, erank=2.6), rec("mhc", 32, erank=1.5)])["verdict"] == "holds (point estimate)"
    g = Claim("loss_gain", "hc", "preln", 32, "x")  # HC improves by 0.2 from L=16 to 32, Pre-LN gets worse
    recs = [rec("hc", 16, val=2.4), rec("hc", 32, val=2.2), rec("preln", 16, val=2.3), rec("preln", 32, val=2.35)]
    r = check(g, recs)
    assert r["verdict"] == "holds (point estimate)" and abs(r["zoo_higher"] - 0.2) < 1e-12


def test_markdown_counts_every_claim():
    res = check_all([])
    text = markdown(res)
    assert text.count("| no data |") == len(res) and f"of {len(res)} claims" in text

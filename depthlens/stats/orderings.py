"""Which of DepthBench's qualitative orderings does a zoo reproduce? (report section)

DepthBench makes a handful of *ordinal* claims at
its deep end (L = 32, ~400M parameters). Absolute shares do not transfer to a 230K-parameter CPU zoo,
but orderings can be checked. Each claim compares two designs at one depth on one headline score:

* "holds"      the lower CI bound of the design claimed higher is above the upper bound of the other;
* "reversed"   the same, the other way round;
* "unresolved" the intervals overlap: the zoo cannot tell (the honest answer at small scale);
* "no data"    a checkpoint or score is missing.

Scores without an interval (effective rank, dead prefix, the loss trend over depth) are compared on
point estimates and marked "point estimate" so nobody mistakes them for a resolved ordering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Claim:
    """`higher` beats `lower` on `score` at depth L, per DepthBench (`paper` is its wording/values)."""

    score: str  # record field prefix: causal | perm | erank_full | dead_prefix | loss_gain
    higher: str
    lower: str
    L: int
    paper: str


CLAIMS: tuple[Claim, ...] = (
    Claim("causal", "full_attnres", "preln", 32, "late causal share > 0.45: Full AttnRes ≈16 % vs Pre-LN ≈1 %"),
    Claim("causal", "hc", "preln", 32, "late causal share > 0.45: HC ≈7 % vs Pre-LN ≈1 %"),
    Claim("causal", "full_attnres", "hc", 32, "late causal share > 0.45: Full AttnRes ≈16 % vs HC ≈7 %"),
    Claim("perm", "full_attnres", "preln", 32, "late permutation share > 0.15: Full AttnRes ≈46 % vs Pre-LN ≈8 %"),
    Claim("perm", "hc", "preln", 32, "late permutation share > 0.15: HC ≈35 % vs Pre-LN ≈8 %"),
    Claim("erank_full", "hc", "mhc", 32, "effective rank of mixing products: HC 2.53–2.81 vs mHC 1.44–1.65"),
    Claim("loss_gain", "hc", "preln", 32, "HC exploits deep-narrow shapes, Pre-LN gains little "
                                           "(val-loss gain from L=16 to L=32)"),
    Claim("loss_gain", "full_attnres", "preln", 32, "Full AttnRes exploits deep-narrow shapes, Pre-LN gains "
                                                     "little (val-loss gain from L=16 to L=32)"),
)


def _find(records: Sequence[dict[str, Any]], design: str, L: int) -> dict[str, Any] | None:
    return next((r for r in records if r.get("design") == design and r.get("n_layer") == L), None)


def _interval(records, design: str, L: int, score: str) -> tuple[float | None, float | None, float | None]:
    """(point, low, high); low/high None when the score has no interval."""
    r = _find(records, design, L)
    if r is None:
        return None, None, None
    if score in ("causal", "perm"):
        return r.get(f"{score}_share"), r.get(f"{score}_ci_low"), r.get(f"{score}_ci_high")
    if score == "loss_gain":  # positive = the deeper model is better (lower val loss)
        shallow = _find(records, design, L // 2)
        if shallow is None or shallow.get("val_loss") is None or r.get("val_loss") is None:
            return None, None, None
        return shallow["val_loss"] - r["val_loss"], None, None
    return r.get(score), None, None


def check(claim: Claim, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One claim against the zoo's summary records (studies/report.py `record`)."""
    hi, hi_lo, hi_hi = _interval(records, claim.higher, claim.L, claim.score)
    lo, lo_lo, lo_hi = _interval(records, claim.lower, claim.L, claim.score)
    out = {"score": claim.score, "higher": claim.higher, "lower": claim.lower, "L": claim.L, "paper": claim.paper,
           "zoo_higher": hi, "zoo_lower": lo, "ci_higher": [hi_lo, hi_hi], "ci_lower": [lo_lo, lo_hi]}
    if hi is None or lo is None:
        return {**out, "verdict": "no data"}
    if None in (hi_lo, hi_hi, lo_lo, lo_hi):
        verdict = "holds (point estimate)" if hi > lo else "reversed (point estimate)" if hi < lo else "tie"
        return {**out, "verdict": verdict}
    if hi_lo > lo_hi:
        return {**out, "verdict": "holds"}
    if lo_lo > hi_hi:
        return {**out, "verdict": "reversed"}
    return {**out, "verdict": "unresolved (CIs overlap)"}


def check_all(records: Sequence[dict[str, Any]], claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    return [check(c, records) for c in claims]


def _fmt(x: float | None, lo: float | None, hi: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if lo is None or hi is None else f"{x:.2f} [{lo:.2f}, {hi:.2f}]"


CAVEAT = ("Each row is an ordinal claim of the paper at L = 32, checked on these checkpoints with 95 % bootstrap "
          "CIs where the score has them. 'unresolved' means the intervals overlap: the checkpoints cannot tell. "
          "On small, briefly trained models an ordering that holds is consistent with the paper, not a "
          "replication of it, and one that does not hold says little about 400M-scale models.")
HEAD = ("claim (paper)", "higher", "lower", "here: higher", "here: lower", "verdict")


def rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[r["paper"], r["higher"], r["lower"], _fmt(r["zoo_higher"], *r["ci_higher"]),
             _fmt(r["zoo_lower"], *r["ci_lower"]), r["verdict"]] for r in results]


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """The report section: one row per claim, verdicts spelled out, and what the table cannot say."""
    lines = ["## DepthBench's orderings at this scale", "", CAVEAT, "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows(results)]
    n = {v: sum(r["verdict"].startswith(v) for r in results) for v in ("holds", "reversed", "unresolved")}
    lines += ["", f"Summary: {n['holds']} hold, {n['reversed']} reversed, {n['unresolved']} unresolved, "
              f"of {len(results)} claims (point-estimate verdicts included)."]
    return "\n".join(lines) + "\n"

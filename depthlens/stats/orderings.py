"""Which of DepthBench's claims does a zoo reproduce? (report section)

DepthBench makes a handful of claims at its deep end (L = 32, ~400M parameters). Absolute values do not
transfer to a 230K-parameter CPU zoo, but orderings and signs can be checked. A claim is about *training runs* of a design, so checkpoints are grouped by (design, L)
over their training seeds (train.json `seed`), and every verdict is read off an interval, never a point:

* "holds"      the interval of the claimed quantity (a difference, a change, a prefix) lies on the claimed side;
* "reversed"   it lies on the other side;
* "unresolved" it straddles the boundary, or there is no interval (e.g. a rank with one seed);
* "no data"    a checkpoint or score is missing.

Intervals (depthlens.stats.intervals): with ≥ 2 seeds, Student t over per-seed paired differences (two
designs scored on the same eval sequences) or Welch t (a quantity of two independent sets of runs); with one
seed, the paired interval over eval sequences, which excludes training variance (the table says so). Every
claim is also checked on the untrained models of the same configs and seeds ("at init"): a claim that
already holds there is a property of the architecture at initialisation, not of what training learned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from depthlens.stats import intervals as iv


@dataclass(frozen=True)
class Claim:
    """What DepthBench says, as it says it.

    kind "order": `higher` beats `lower` on `score` (a share: causal | perm; or erank_full) at depth L.
    kind "sign":  `higher`'s `score` moves in direction `sign` (+1 up, −1 down); loss_change = eval loss at
                  L minus eval loss at L/2 (negative: the deeper model is better).
    kind "at_least": `higher`'s `score` (dead_prefix) is ≥ `bound`.
    """

    kind: str
    score: str
    higher: str
    lower: str | None
    L: int
    paper: str
    sign: int = 1
    bound: float = 0.0


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "order", "causal", "full_attnres", "preln", 32, "late causal share > 0.45: Full AttnRes ≈16 % vs Pre-LN ≈1 %"
    ),
    Claim("order", "causal", "hc", "preln", 32, "late causal share > 0.45: HC ≈7 % vs Pre-LN ≈1 %"),
    Claim("order", "causal", "full_attnres", "hc", 32, "late causal share > 0.45: Full AttnRes ≈16 % vs HC ≈7 %"),
    Claim(
        "order", "perm", "full_attnres", "preln", 32, "late permutation share > 0.15: Full AttnRes ≈46 % vs Pre-LN ≈8 %"
    ),
    Claim("order", "perm", "hc", "preln", 32, "late permutation share > 0.15: HC ≈35 % vs Pre-LN ≈8 %"),
    Claim("order", "erank_full", "hc", "mhc", 32, "effective rank of mixing products: HC 2.53–2.81 vs mHC 1.44–1.65"),
    Claim("sign", "loss_change", "hc", None, 32, "HC improves from L = 16 to L = 32 (loss falls)", sign=-1),
    Claim(
        "sign",
        "loss_change",
        "full_attnres",
        None,
        32,
        "Full AttnRes improves from L = 16 to L = 32 (loss falls)",
        sign=-1,
    ),
    Claim("sign", "loss_change", "preln", None, 32, "Pre-LN worsens from L = 16 to L = 32 (loss rises)", sign=1),
    Claim(
        "at_least",
        "dead_prefix",
        "block_attnres",
        None,
        32,
        "Block AttnRes has a dead prefix (≈8 layers at L = 32): k*(0.05) ≥ 1",
        bound=1.0,
    ),
)

SHARE_SCORES = ("causal", "perm")


def claim_cells(score: str, claims: Sequence[Claim] | None = None) -> frozenset[tuple[str, int]]:
    """The (design, depth) cells the claims on `score` name (default: `CLAIMS`): where a study limited to the
    claims computes it."""
    cs = CLAIMS if claims is None else claims
    return frozenset((d, c.L) for c in cs if c.score == score for d in (c.higher, c.lower) if d is not None)


def runs(records: Sequence[dict[str, Any]], design: str | None, L: int) -> list[dict[str, Any]]:
    """The records of one (design, depth), one per training seed, in seed order."""
    return sorted(
        (r for r in records if r.get("design") == design and r.get("n_layer") == L),
        key=lambda r: (r.get("seed") is None, r.get("seed") or 0, r.get("checkpoint", "")),
    )


def _value(r: dict[str, Any], score: str, untrained: bool) -> float | None:
    if score in SHARE_SCORES:
        return r.get(f"{score}_share_untrained" if untrained else f"{score}_share")
    if score == "loss_change":
        return r.get("eval_loss_untrained" if untrained else "eval_loss")
    return r.get(f"{score}_untrained" if untrained else score)


def _values(rs: Sequence[dict[str, Any]], score: str, untrained: bool) -> list[float]:
    return [float(v) for v in (_value(r, score, untrained) for r in rs) if v is not None]


def design_value(rs: Sequence[dict[str, Any]], score: str, untrained: bool = False) -> iv.Interval:
    """A design's value at one depth: the t interval over seeds; one seed: the record's own interval."""
    vals = _values(rs, score, untrained)
    if len(vals) == 1 and score in SHARE_SCORES and not untrained:
        r = rs[0]
        lo, hi = r.get(f"{score}_ci_low"), r.get(f"{score}_ci_high")
        return iv.Interval(
            vals[0],
            float("nan") if lo is None else lo,
            float("nan") if hi is None else hi,
            str(r.get(f"{score}_ci_method")),
            iv.SEQUENCES,
            1,
        )
    return iv.t_interval(vals, bounds=(0.0, 1.0) if score in SHARE_SCORES else (-float("inf"), float("inf")))


def _from_rows(rows: Sequence[dict[str, Any]], tag: str) -> iv.Interval | None:
    """Paired per-seed differences (report.build.comparisons rows) → one interval over seeds or sequences."""
    rows = [r for r in rows if r.get(f"{tag}diff") is not None]
    if not rows:
        return None
    if len(rows) == 1:
        r = rows[0]
        return iv.Interval(
            r[f"{tag}diff"],
            _nan(r.get(f"{tag}low")),
            _nan(r.get(f"{tag}high")),
            str(r.get(f"{tag}method")),
            iv.SEQUENCES,
            1,
        )
    return iv.t_interval([r[f"{tag}diff"] for r in rows], method=iv.PAIRED_T)


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def claim_interval(
    claim: Claim, records: Sequence[dict[str, Any]], comparisons: Sequence[dict[str, Any]] = (), untrained: bool = False
) -> iv.Interval | None:
    """The interval a verdict is read from: a difference (order), a change (sign) or a value (at_least)."""
    tag = "untrained_" if untrained else ""
    hi = runs(records, claim.higher, claim.L)
    if claim.kind == "order":
        lo = runs(records, claim.lower, claim.L)
        if claim.score in SHARE_SCORES:
            rows = [
                c
                for c in comparisons
                if (c.get("score"), c.get("higher"), c.get("lower"), c.get("L"))
                == (claim.score, claim.higher, claim.lower, claim.L)
            ]
            got = _from_rows(rows, tag)
            if got is not None:
                return got
        if not _values(hi, claim.score, untrained) or not _values(lo, claim.score, untrained):
            return None
        return iv.welch_interval(_values(hi, claim.score, untrained), _values(lo, claim.score, untrained))
    if claim.kind == "sign":
        shallow = runs(records, claim.higher, claim.L // 2)
        rows = [
            c
            for c in comparisons
            if (c.get("score"), c.get("higher"), c.get("L")) == (claim.score, claim.higher, claim.L)
        ]
        a, b = _values(hi, claim.score, untrained), _values(shallow, claim.score, untrained)
        if not a or not b:
            return None
        if min(len(a), len(b)) < 2:
            got = _from_rows(rows, tag)
            if got is not None:
                return got
        return iv.welch_interval(a, b)
    vals = _values(hi, claim.score, untrained)
    return iv.t_interval(vals) if vals else None


def verdict(claim: Claim, it: iv.Interval | None) -> str:
    if it is None:
        return "no data"
    if not (it.low == it.low and it.high == it.high):  # NaN: no interval
        return "unresolved"
    if claim.kind == "at_least":
        return "holds" if it.low >= claim.bound else "reversed" if it.high < claim.bound else "unresolved"
    side = it.excludes_zero * (claim.sign if claim.kind == "sign" else 1)
    return "holds" if side > 0 else "reversed" if side < 0 else "unresolved"


def check(
    claim: Claim, records: Sequence[dict[str, Any]], comparisons: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """One claim against the report's records (studies/report.py `record`) and paired comparisons."""
    hi = runs(records, claim.higher, claim.L)
    lo = (
        runs(records, claim.lower, claim.L)
        if claim.kind == "order"
        else runs(records, claim.higher, claim.L // 2)
        if claim.kind == "sign"
        else []
    )
    score = "eval_loss" if claim.score == "loss_change" else claim.score
    trained, init = claim_interval(claim, records, comparisons), claim_interval(claim, records, comparisons, True)
    seeds = sorted({r.get("seed") for r in [*hi, *lo]}, key=lambda s: (s is None, s or 0))
    one = trained is not None and trained.unit == iv.SEQUENCES
    note = "one seed: the interval excludes training variance" if one else None
    if trained is not None and trained.unit == iv.SEEDS and trained.n_units < 2:
        note = "one seed: no interval for this score"
    out = {
        "kind": claim.kind,
        "score": claim.score,
        "higher": claim.higher,
        "lower": claim.lower,
        "L": claim.L,
        "paper": claim.paper,
        "seeds": seeds,
        "n_runs": [len(hi), len(lo)],
        "value_higher": _dict(design_value(hi, "eval_loss" if claim.kind == "sign" else score)) if hi else None,
        "value_lower": _dict(design_value(lo, "eval_loss" if claim.kind == "sign" else score)) if lo else None,
        "interval": _dict(trained),
        "verdict": verdict(claim, trained),
        "interval_untrained": _dict(init),
        "verdict_untrained": verdict(claim, init),
        "note": note,
    }
    return out


def _dict(it: iv.Interval | None) -> dict[str, Any] | None:
    if it is None:
        return None
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in it.as_dict().items()}


def check_all(
    records: Sequence[dict[str, Any]], comparisons: Sequence[dict[str, Any]] = (), claims: Sequence[Claim] = CLAIMS
) -> list[dict[str, Any]]:
    return [check(c, records, comparisons) for c in claims]


def _fmt(d: dict[str, Any] | None, digits: int = 3) -> str:
    if d is None or d.get("estimate") is None:
        return "–"
    x = f"{d['estimate']:.{digits}g}"
    if d.get("low") is None or d.get("high") is None:
        return x
    return f"{x} [{d['low']:.{digits}g}, {d['high']:.{digits}g}]"


CAVEAT = (
    "Each row is a claim of the paper at L = 32, checked on these checkpoints over every training seed "
    "present (a design's value: the t interval over seeds; with one seed, its interval over eval sequences, "
    "which excludes training variance). The verdict is read off the 95 % interval of the claimed quantity: "
    "a paired difference between two designs (same eval sequences, same seeds), a change from L = 16 to "
    "L = 32, or a value against a bound; 'unresolved' means the interval straddles the boundary or does not "
    "exist. 'at init' is the same check on the untrained models of the same configs and seeds: a claim that "
    "already holds there comes from the architecture, not from training. On small, briefly trained models a "
    "claim that holds is consistent with the paper, not a replication of it."
)
HEAD = (
    "claim (paper)",
    "seeds",
    "here: first design",
    "here: second (or L/2)",
    "difference / change [95 %]",
    "verdict",
    "at init: difference [95 %]",
    "at init",
)


def rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in results:
        seeds = ",".join(str(s) for s in r["seeds"]) or "–"
        verdict_text = r["verdict"] + (f" ({r['note']})" if r.get("note") else "")
        out.append(
            [
                r["paper"],
                seeds,
                _fmt(r["value_higher"]),
                _fmt(r["value_lower"]),
                _fmt(r["interval"]),
                verdict_text,
                _fmt(r["interval_untrained"]),
                r["verdict_untrained"],
            ]
        )
    return out


def summary_line(results: Sequence[dict[str, Any]]) -> str:
    n = {v: sum(r["verdict"] == v for r in results) for v in ("holds", "reversed", "unresolved", "no data")}
    init = sum(r["verdict"] == "holds" and r["verdict_untrained"] == "holds" for r in results)
    return (
        f"Summary: {n['holds']} hold, {n['reversed']} reversed, {n['unresolved']} unresolved, {n['no data']} "
        f"without data, of {len(results)} claims (every verdict from an interval); {init} of those that hold "
        "already hold at init."
    )


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """The report section: one row per claim, verdicts spelled out, and what the table cannot say."""
    lines = [
        "## DepthBench's claims at this scale",
        "",
        CAVEAT,
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows(results)]
    lines += ["", summary_line(results)]
    return "\n".join(lines) + "\n"

"""Which of DepthBench's claims does a zoo reproduce? (report section)

DepthBench makes a handful of claims at its deep end (L = 32, ~400M parameters). Absolute values do not
transfer to a 230K-parameter CPU zoo, but orderings and signs can be checked. A claim is about *training runs* of a design, so checkpoints are grouped by (design, L)
over their training seeds (train.json `seed`), and every verdict is read off an interval, never a point:

* "holds"      the interval of the claimed quantity (a difference, a change, a prefix) lies on the claimed side;
* "reversed"   it lies on the other side: the opposite of the claim is seen;
* "absent"     what the claim says is present is not there: a value claimed at least `bound` lies below it
               (a dead prefix of k* = 0), or a difference is exactly 0 with a zero-width interval;
               "absent, as at init" when the untrained models show the same;
* "unresolved" it straddles the boundary, or there is no interval (e.g. a rank with one seed);
* "no data"    a checkpoint or score is missing.

Intervals: with ≥ 2 seeds, a share or loss claim uses the crossed seed × sequence interval
(depthlens.stats.crossed: every run is scored on the same eval sequences, so the part of the eval noise they
share is added to the runs' spread) when the report computed it (`"crossed"` rows of its comparisons); reports
without those rows fall back to Student t over per-seed differences. The effective rank and the dead prefix are
stored per run, not per sequence (HC's maps depend on the input, so the rank has eval noise too), and use Welch /
Student t over runs, which leaves their shared eval-sequence noise out. With one
seed, the paired interval over eval sequences, which excludes training variance (the table says so). Every
claim is also checked on the untrained models of the same configs and seeds ("at init"): a claim that
already holds there is a property of the architecture at initialisation, not of what training learned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    paper_values: tuple[float, float] | None = None  # the paper's (higher, lower) where it gives numbers


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "order",
        "causal",
        "full_attnres",
        "preln",
        32,
        "late causal share > 0.45: Full AttnRes ≈16 % vs Pre-LN ≈1 %",
        paper_values=(0.16, 0.01),
    ),
    Claim(
        "order",
        "causal",
        "hc",
        "preln",
        32,
        "late causal share > 0.45: HC ≈7 % vs Pre-LN ≈1 %",
        paper_values=(0.07, 0.01),
    ),
    Claim(
        "order",
        "causal",
        "full_attnres",
        "hc",
        32,
        "late causal share > 0.45: Full AttnRes ≈16 % vs HC ≈7 %",
        paper_values=(0.16, 0.07),
    ),
    Claim(
        "order",
        "perm",
        "full_attnres",
        "preln",
        32,
        "late permutation share > 0.15: Full AttnRes ≈46 % vs Pre-LN ≈8 %",
        paper_values=(0.46, 0.08),
    ),
    Claim(
        "order",
        "perm",
        "hc",
        "preln",
        32,
        "late permutation share > 0.15: HC ≈35 % vs Pre-LN ≈8 %",
        paper_values=(0.35, 0.08),
    ),
    Claim(
        "order",
        "erank_full",
        "hc",
        "mhc",
        32,
        "effective rank of mixing products: HC 2.53–2.81 vs mHC 1.44–1.65",
        paper_values=(2.67, 1.545),
    ),
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
RANK_ONE = 1.01  # an effective rank below this: the product has collapsed to rank 1 (a degenerate readout)


def paper_delta(claim: Claim) -> float | None:
    """The paper's difference higher − lower (an order claim with numbers), else None (a direction only)."""
    return None if claim.paper_values is None else claim.paper_values[0] - claim.paper_values[1]


def crossed_row(claim: Claim, comparisons: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The report's crossed seed × sequence row of this claim (studies/claims.py), if it computed one."""
    return next(
        (
            c
            for c in comparisons
            if c.get("crossed")
            and (c.get("score"), c.get("higher"), c.get("lower"), c.get("L"))
            == (claim.score, claim.higher, claim.lower, claim.L)
        ),
        None,
    )


def _from_crossed(d: dict[str, Any] | None) -> iv.Interval | None:
    """A crossed row's interval (None when it has none: one seed)."""
    if not d or d.get("low") is None or d.get("high") is None:
        return None
    return iv.Interval(d["estimate"], d["low"], d["high"], str(d["method"]), iv.SEEDS, int(d["n_units"]))


def paper_ratios(records: Sequence[dict[str, Any]], L: int = 32) -> dict[str, tuple[float, float]]:
    """Per score the claims give paper values for ("causal", "perm"): the (smallest, largest) ratio of a design's
    mean share over the seeds of `records` (a report's summary.json) at depth `L` to the paper's value for that
    design; a score whose designs have no run at `L` is left out."""
    paper: dict[tuple[str, str], float] = {}
    for c in CLAIMS:
        if c.score in ("causal", "perm") and c.paper_values and c.higher and c.lower:
            paper[(c.score, c.higher)], paper[(c.score, c.lower)] = c.paper_values
    out: dict[str, tuple[float, float]] = {}
    for score in ("causal", "perm"):
        ratios = []
        for (s, design), value in paper.items():
            mine = [r[f"{score}_share"] for r in records if r.get("design") == design and r.get("n_layer") == L]
            if s == score and mine:
                ratios.append(float(np.mean(mine)) / value)
        if ratios:
            out[score] = (min(ratios), max(ratios))
    return out


def claim_cells_of(claim: Claim) -> tuple[tuple[str | None, int], ...]:
    """The (design, depth) cells one claim's verdict pools runs of: both designs (order), the design at L and L/2
    (sign), the design (at_least)."""
    if claim.kind == "order":
        return ((claim.higher, claim.L), (claim.lower, claim.L))
    if claim.kind == "sign":
        return ((claim.higher, claim.L), (claim.higher, claim.L // 2))
    return ((claim.higher, claim.L),)


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
    got_crossed = _from_crossed((crossed_row(claim, comparisons) or {}).get(f"{tag}difference"))
    if got_crossed is not None:
        return got_crossed
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
    """holds / reversed / absent / unresolved / no data, read off the interval (module docstring)."""
    if it is None:
        return "no data"
    if not (it.low == it.low and it.high == it.high):  # NaN: no interval
        return "unresolved"
    if claim.kind == "at_least":
        return "holds" if it.low >= claim.bound else "absent" if it.high < claim.bound else "unresolved"
    if it.low == it.high == 0:
        return "absent"
    side = it.excludes_zero * (claim.sign if claim.kind == "sign" else 1)
    return "holds" if side > 0 else "reversed" if side < 0 else "unresolved"


def with_init(trained: str, init: str) -> str:
    """The trained verdict with its at-init counterpart where that is what it means: "absent, as at init"."""
    return "absent, as at init" if trained == "absent" and init == "absent" else trained


def what_this_is(
    claim: Claim, trained: iv.Interval | None, values: Sequence[dict[str, Any] | None], gains: dict[str, list[float]]
) -> list[str]:
    """One short line per degenerate readout: a rank-1 effective rank (with its forward gain), a zero-width
    interval."""
    out = []
    if claim.score == "erank_full":
        for design, v in zip((claim.higher, claim.lower), values):
            if v and v.get("estimate") is not None and v["estimate"] < RANK_ONE:
                g = gains.get(design or "")
                gain = f", forward gain {min(g):.2g}–{max(g):.2g}" if g else ""
                out.append(
                    f"what this is: {design}'s mixing product has collapsed to rank 1 (erank {v['estimate']:.4g}"
                    f"{gain}): the maps blow up along one direction, not a learned low-rank mixing"
                )
    if trained is not None and trained.low == trained.high and trained.low == trained.low:
        out.append(
            "what this is: a zero-width interval: every run gave the same value, so no spread could be "
            "estimated (more runs could still differ)"
        )
    return out


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
    # the runs the at-init counterpart pools: those with an untrained value (`--untrained-seeds` builds twins for
    # the first seeds only), so a cell of 8 trained runs may have 3 at init
    at_init = [[r for r in rs if _value(r, score, True) is not None] for rs in (hi, lo)]
    seeds_init = sorted({r.get("seed") for r in [*at_init[0], *at_init[1]]}, key=lambda s: (s is None, s or 0))
    one = trained is not None and trained.unit == iv.SEQUENCES
    note = "one seed: the interval excludes training variance" if one else None
    if trained is not None and trained.unit == iv.SEEDS and trained.n_units < 2:
        note = "one seed: no interval for this score"
    row = crossed_row(claim, comparisons) or {}
    values = [_dict(design_value(hi, "eval_loss" if claim.kind == "sign" else score)) if hi else None]
    values.append(_dict(design_value(lo, "eval_loss" if claim.kind == "sign" else score)) if lo else None)
    for i, v in enumerate(row.get("values") or []):  # the crossed design values, where computed
        if i < 2 and v.get("low") is not None:
            values[i] = {k: v.get(k) for k in ("estimate", "low", "high", "method", "unit", "n_units")}
    extra = [n for n in [(row.get("difference") or {}).get("coverage_note")] if n and trained is not None]
    gains = {
        c["design"]: c["gain_fwd"]
        for c in comparisons
        if c.get("degenerate") and c.get("score") == claim.score and c.get("L") == claim.L
    }
    extra += what_this_is(claim, trained, values, gains)
    extra += [
        f"mixed recipes pooled: {c['line']}"
        for c in comparisons
        if c.get("mixed_recipe") and (c.get("design"), c.get("L")) in claim_cells_of(claim)
    ]
    if extra:
        note = "; ".join([*([note] if note else []), *extra])
    v_trained, v_init = verdict(claim, trained), verdict(claim, init)
    out = {
        "kind": claim.kind,
        "score": claim.score,
        "higher": claim.higher,
        "lower": claim.lower,
        "L": claim.L,
        "paper": claim.paper,
        "seeds": seeds,
        "n_runs": [len(hi), len(lo)],
        "value_higher": values[0],
        "value_lower": values[1],
        "interval": _dict(trained),
        "verdict": with_init(v_trained, v_init),
        "interval_untrained": _dict(init),
        "verdict_untrained": v_init,
        "seeds_untrained": seeds_init,
        "n_runs_untrained": [len(at_init[0]), len(at_init[1])],
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
    "present. Shares and losses: every run is scored on the same eval sequences, so a design value and a "
    "difference between designs (or depths) get the crossed seed × sequence interval (two-way random effects, "
    "Satterthwaite t: the runs' spread plus the eval noise they share), where the report computed it; the "
    "effective rank and the dead prefix (stored per run, not per sequence), Welch / Student t over runs, "
    "without their shared eval-sequence noise; with one seed, the interval over eval "
    "sequences, which excludes training variance. Losses are the report's eval loss (the table's 'eval loss "
    "(report)' column, on the eval set of the eval line), not train.json's val loss. The verdict is read off "
    "the 95 % interval of the claimed "
    "quantity: 'holds' on the claimed side, 'reversed' on the other, 'absent' when what is claimed is not "
    "there (a bound not reached, a difference of exactly 0), 'absent, as at init' when the untrained models "
    "show the same, 'unresolved' when the interval straddles the boundary or does not exist; a note beside a "
    "verdict gives the interval's simulated coverage where it falls short of 90 %, and says what a degenerate "
    "readout is. 'at init' is the same check on the untrained models of the same configs and seeds: a claim "
    "that already holds there comes from the architecture, not from training. On small, briefly trained "
    "models a claim that holds is consistent with the paper, not a replication of it."
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


def seed_list(seeds: Sequence[int | None]) -> str:
    """Seeds as ranges: [0, 1, 2, 5] -> "seeds 0-2,5"; [3] -> "seed 3"; an unknown seed is "?"."""
    known = sorted(s for s in seeds if s is not None)
    parts: list[str] = []
    for s in known:
        if parts and parts[-1].split("-")[-1] == str(s - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{s}"
        else:
            parts.append(str(s))
    parts += ["?"] * (len(seeds) - len(known))
    return ("seed " if len(seeds) == 1 else "seeds ") + ",".join(parts)


def _at_init_runs(r: dict[str, Any]) -> str:
    """Which runs the at-init counterpart pools, where they are fewer than the trained ones (`--untrained-seeds`)."""
    got, n, m = r.get("seeds_untrained"), r.get("n_runs_untrained"), r.get("n_runs")
    if got is None or not n or not m or got == r["seeds"] or r.get("interval_untrained") is None:
        return ""
    runs = f"{n[0]} of {m[0]} runs" if not m[1] else f"{n[0]} + {n[1]} of {m[0]} + {m[1]} runs"
    return f" (at init: {seed_list(got)}, {runs})"


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
                _fmt(r["interval_untrained"]) + _at_init_runs(r),
                r["verdict_untrained"],
            ]
        )
    return out


def summary_line(results: Sequence[dict[str, Any]]) -> str:
    n = {v: sum(r["verdict"] == v for r in results) for v in ("holds", "reversed", "unresolved", "no data")}
    absent = sum(r["verdict"].startswith("absent") for r in results)
    as_init = sum(r["verdict"] == "absent, as at init" for r in results)
    init = sum(r["verdict"] == "holds" and r["verdict_untrained"] == "holds" for r in results)
    return (
        f"Summary: {n['holds']} hold, {n['reversed']} reversed, {absent} absent ({as_init} as at init), "
        f"{n['unresolved']} unresolved, {n['no data']} without data, of {len(results)} claims (every verdict "
        f"from an interval); {init} of those that hold already hold at init."
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

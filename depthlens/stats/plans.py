"""The power plan of the claims: how many training runs per design (and eval sequences) a claim's crossed
difference needs to resolve, at the size observed and at the paper's size (`stats.crossed.plan`).

Read by the report page (render), `depthlens plan` (cli) and `studies.claims`, so it sits in `stats`, below all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from depthlens.io.jsonsafe import jsonable
from depthlens.stats import crossed as cr


def plan_rows(
    crossed: Sequence[dict[str, Any]], claims: Sequence[Any], *, target: float = 0.8, sequences: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """For each claim with a crossed difference: the runs per design (at the current eval sequences and at
    `sequences`) that resolve a difference of the observed size and of the paper's size with `target` power."""
    from depthlens.stats.orderings import paper_delta

    out = []
    for c in claims:
        row = next(
            (
                r
                for r in crossed
                if r.get("crossed")
                and (r["score"], r["higher"], r["lower"], r["L"]) == (c.score, c.higher, c.lower, c.L)
            ),
            None,
        )
        if row is None or not row.get("difference") or not row["difference"].get("components"):
            continue
        d = row["difference"]
        comp = cr.Components.from_dict(d["components"])
        n = int(d["n_seq"])
        Ns = sorted({n, 2 * n, 4 * n, *sequences})
        entry: dict[str, Any] = {"claim": c.paper, "score": c.score, "higher": c.higher, "lower": c.lower, "L": c.L}
        entry["observed"] = cr.plan(comp, d["estimate"], target=target, sequences=Ns) if d["estimate"] else None
        pd = paper_delta(c)
        entry["paper"] = cr.plan(comp, pd, target=target, sequences=Ns) if pd else None
        entry["paper_delta"] = pd
        entry["n_seq"] = n
        entry["n_runs"] = list(comp.n_seeds)
        out.append(jsonable(entry))
    return out


PLAN_TITLE = "What it would take: runs and eval sequences for 80 % power"
PLAN_NOTE = (
    "For each claim (in a report: each unresolved one), from the crossed variance components of its difference "
    "(the runs' spread per "
    "design, the part of the eval noise the runs share): how many training runs per design a 95 % interval "
    "needs to exclude 0 with 80 % power, at this report's eval sequences (N) and at 2N and 4N, for a true "
    "difference of the size observed here and of the paper's size (where the paper gives numbers; the loss "
    "claims give a direction only). The run part scales as 1/runs, the shared sequence part and the run × "
    "sequence interaction as 1/N (exact for a loss, a linearisation for a share); power from the noncentral t "
    "with Satterthwaite df (depthlens.stats.crossed.plan, checked against a simulation with known power). "
    "'>256': not within 256 runs. `depthlens plan` prints the same for any set of checkpoints or a report."
)
PLAN_HEAD = (
    "claim (paper)",
    "runs x sequences now",
    "power now: observed / paper size",
    "runs for the observed difference at N / 2N / 4N",
    "runs for the paper's difference at N / 2N / 4N",
)


def _needed(p: dict[str, Any] | None) -> str:
    if not p:
        return "–"
    vals = list(p["seeds_needed"].values())
    return " / ".join(">256" if v is None else str(v) for v in vals) + f"  (Δ = {p['delta']:+.3g})"


def plan_table(plans: Sequence[dict[str, Any]]) -> list[list[str]]:
    out = []
    for p in plans:
        obs, pap = p.get("observed"), p.get("paper")
        now = " / ".join(
            "–" if q is None or q.get("power_now") is None else f"{q['power_now']:.2f}" for q in (obs, pap)
        )
        out.append(
            [
                p["claim"],
                f"{'+'.join(str(n) for n in p['n_runs'])} x {p['n_seq']}",
                now,
                _needed(obs),
                _needed(pap),
            ]
        )
    return out


def unresolved_plans(comparisons: Sequence[dict[str, Any]], checked: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan rows of the claims whose verdict is unresolved (orderings.check_all results, same order)."""
    from depthlens.stats.orderings import CLAIMS

    todo = [c for c, r in zip(CLAIMS, checked) if r["verdict"] == "unresolved"]
    return plan_rows(comparisons, todo)

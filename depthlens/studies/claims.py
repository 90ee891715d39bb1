"""The claims' design values and differences with the crossed seed × sequence interval, and the power plan.

Every training run of a design is scored on the same eval sequences, so a design value (the mean over its runs)
and a difference between designs get `stats.crossed`'s interval: the runs' spread plus the part of the eval noise
that every run shares. Per run the per-sequence information is what the report already computes for its
per-checkpoint sequence intervals (`sweep.share_interval`): delete-one jackknife replicates of the causal
size-fixed max share, bootstrap replicates of the permutation share on resamples every run shares (one `seed`),
and the per-sequence clean loss for a loss change.

Inputs are a mapping run key (design, L, seed) -> {metric: Dataset} (a report's entries, or a report
directory's merged datasets: `runs_from_report`), so the report and `depthlens plan` share one code path.
Rows go into the report's `comparisons` with `"crossed": true` (orderings reads them first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.errors import DepthlensError
from depthlens.io.jsonsafe import jsonable
from depthlens.stats import crossed as cr

RunKey = tuple[str | None, int, int | None]  # design, depth, training seed
Runs = Mapping[RunKey, Mapping[str, Any]]  # -> {metric: xr.Dataset}
SHARE = {"causal": ("causal", "causal"), "perm": ("permutation", "perm_abs")}  # claim score -> (metric, key)
KIND = {"causal": cr.JACKKNIFE, "perm": cr.BOOTSTRAP, "loss_change": cr.JACKKNIFE}
SIM_KIND = {"causal": "causal", "perm": "perm", "loss_change": "mean"}  # which simulated coverage applies


def _runs_of(runs: Runs, design: str, L: int) -> list[tuple[RunKey, Mapping[str, Any]]]:
    return sorted(((k, v) for k, v in runs.items() if k[0] == design and k[1] == L), key=lambda kv: kv[0][2] or 0)


def _n_seq(dss: Sequence[Any]) -> int:
    return min(int(ds.sizes.get("sequence", 0)) for ds in dss) if dss else 0


def share_group(dss: Sequence[Any], score: str, n: int, *, n_boot: int, seed: int) -> cr.Group | None:
    """Per-run share estimates and replicates on the first n sequences (the same resamples for every run)."""
    from depthlens.diagnostics import registry
    from depthlens.diagnostics.sweep import share_interval

    _, key = SHARE[score]
    theta = registry.score(key).theta
    est, reps = [], []
    for ds in dss:
        x = ds.isel(sequence=slice(0, n)) if ds.sizes["sequence"] > n else ds
        try:
            it, r, _, _ = share_interval(x, key, theta, start="quarter", n_boot=n_boot, seed=seed)
        except DepthlensError:
            return None
        if r.size == 0:
            return None
        est.append(it.estimate)
        reps.append(r)
    return cr.Group.of(est, np.stack(reps)) if est else None


def loss_group(dss: Sequence[Any], n: int) -> cr.Group | None:
    y = np.stack([np.asarray(ds["clean_loss_seq"].values[:n], dtype=np.float64) for ds in dss])
    return cr.Group.of_means(y) if np.isfinite(y).all() and n >= 2 else None


def _groups(
    runs: Runs, claim: Any, n_boot: int, seed: int
) -> tuple[list[cr.Group], list[float], int, list[int]] | None:
    """The groups (and weights) of a claim's contrast: order = higher − lower, sign = L − L/2."""
    if claim.kind == "order" and claim.score in SHARE:
        metric = SHARE[claim.score][0]
        cells = [(claim.higher, claim.L), (claim.lower, claim.L)]
    elif claim.kind == "sign" and claim.score == "loss_change":
        metric = "causal"
        cells = [(claim.higher, claim.L), (claim.higher, claim.L // 2)]
    else:
        return None
    per = [[v[metric] for _, v in _runs_of(runs, d, L) if metric in v] for d, L in cells]
    if not all(per):
        return None
    n = _n_seq([ds for p in per for ds in p])
    if n < 2:
        return None
    gs = [
        share_group(p, claim.score, n, n_boot=n_boot, seed=seed) if claim.score in SHARE else loss_group(p, n)
        for p in per
    ]
    if any(g is None for g in gs):
        return None
    return [g for g in gs if g is not None], [1.0, -1.0], n, [len(p) for p in per]


def _interval_row(
    groups: Sequence[cr.Group], weights: Sequence[float], kind: str, n: int, sim_kind: str
) -> dict[str, Any]:
    bounds = (0.0, 1.0) if len(groups) == 1 and sim_kind != "mean" else (-math.inf, math.inf)
    it, comp = cr.crossed_interval(groups, weights, kind=kind, n_sequences=n, bounds=bounds)
    S = min(g.estimates.size for g in groups)
    return {
        "estimate": it.estimate,
        "low": it.low,
        "high": it.high,
        "method": it.method,
        "unit": "training seeds x eval sequences (crossed)",
        "n_units": S,
        "n_seq": n,
        "df": comp.df if comp else None,
        "components": comp.as_dict() if comp else None,
        "coverage_note": cr.coverage_note(sim_kind, S, n) if comp else None,
        "zero_width": bool(comp is not None and it.low == it.high),
    }


def crossed_rows(runs: Runs, untrained: Runs, claims: Sequence[Any], *, n_boot: int, seed: int) -> list[dict[str, Any]]:
    """Per claim on a share or a loss change: the crossed interval of its contrast and of each side's design
    value, trained and untrained (`untrained_*`). One row per claim, `"crossed": true`."""
    out = []
    for c in claims:
        row: dict[str, Any] = {"crossed": True, "score": c.score, "higher": c.higher, "lower": c.lower, "L": c.L}
        for tag, rs in (("", runs), ("untrained_", untrained)):
            got = _groups(rs, c, n_boot, seed)
            if got is None:
                continue
            gs, w, n, sizes = got
            kind, sim = KIND[c.score], SIM_KIND[c.score]
            row[f"{tag}difference"] = _interval_row(gs, w, kind, n, sim)
            row[f"{tag}values"] = [_interval_row([g], [1.0], kind, n, sim) for g in gs]
            row[f"{tag}n_runs"] = sizes
        if "difference" in row or "untrained_difference" in row:
            out.append(jsonable(row))
    return out


def degenerate_rows(runs: Runs, claims: Sequence[Any]) -> list[dict[str, Any]]:
    """For each claim on the effective rank: per design the full-product forward gain (mean over tokens) of every
    run, so a rank of 1.00 can be read as what it is (the maps blowing up to rank 1)."""
    out = []
    for c in claims:
        if c.score != "erank_full":
            continue
        for d in (c.higher, c.lower):
            gains = []
            for _, v in _runs_of(runs, d, c.L):
                ds = v.get("rank")
                if ds is not None and "gain_fwd" in ds:
                    g = ds["gain_fwd"]
                    g = g.sel(product="full") if "product" in g.dims else g
                    g = g.sel(statistic="mean") if "statistic" in g.dims else g
                    gains.append(float(np.asarray(g.values).ravel()[0]))
            if gains:
                out.append(
                    jsonable({"degenerate": True, "score": "erank_full", "design": d, "L": c.L, "gain_fwd": gains})
                )
    return out


# ---------------------------------------------------------------------------------------------------------------
# power plan


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


def runs_from_report(directory: str | Path, metrics: Sequence[str] = ("causal", "permutation", "rank")) -> Runs:
    """A report directory's merged per-checkpoint datasets as a run mapping (design, L, seed) -> {metric: ds},
    seeds from its summary.json records."""
    import json

    import xarray as xr

    d = Path(directory)
    recs = json.loads((d / "summary.json").read_text(encoding="utf-8"))
    key = {r["checkpoint"]: (r["design"], int(r["n_layer"]), r.get("seed")) for r in recs}
    runs: dict[RunKey, dict[str, Any]] = {}
    for m in metrics:
        for f in sorted(d.glob(f"{m}*.nc")):
            if f.stem != m and not f.stem.startswith(f"{m}_l"):
                continue
            ds = xr.open_dataset(f)
            for name in ds["checkpoint"].values:
                k = key.get(str(name))
                if k is not None:
                    runs.setdefault(k, {})[m] = ds.sel(checkpoint=name)
    return runs


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


def plan_markdown(plans: Sequence[dict[str, Any]]) -> str:
    from depthlens.render.pages import _md_table

    if not plans:
        return ""
    return "\n".join([f"## {PLAN_TITLE}", "", PLAN_NOTE, "", _md_table(PLAN_HEAD, plan_table(plans)), ""]) + "\n"

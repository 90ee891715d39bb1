"""The claims' design values and differences with the crossed seed × sequence interval, and the power plan.

Every training run of a design is scored on the same eval sequences, so a design value (the mean over its runs)
and a difference between designs get `stats.crossed`'s interval: the runs' spread plus the part of the eval noise
that every run shares. Per run the per-sequence information is what the report already computes for its
per-checkpoint sequence intervals (`sweep.share_interval`): delete-one jackknife replicates of the causal
size-fixed max share, bootstrap replicates of the permutation share on resamples every run shares (one `seed`),
and the per-sequence clean loss for a loss change.

Inputs are a mapping run key (design, L, seed) -> {metric: Dataset} (a report's entries, or a report
directory's merged datasets: `runs_from_report`), so the report and `depthlens plan` share one code path.
Rows go into the report's `comparisons` with `"crossed": true` (orderings reads them first). The power plan over
those rows is `stats.plans` (the report page and `depthlens plan` read it).
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
from depthlens.stats.orderings import seed_list

RunKey = tuple[str | None, int, int | None]  # design, depth, training seed
Runs = Mapping[RunKey, Mapping[str, Any]]  # -> {metric: xr.Dataset}
KIND = {"causal": cr.JACKKNIFE, "perm": cr.BOOTSTRAP, "loss_change": cr.JACKKNIFE}
SIM_KIND = {"causal": "causal", "perm": "perm", "loss_change": "mean"}  # which simulated coverage applies


def _share(score: str) -> tuple[str, str] | None:
    """(the diagnostic, its headline score key) of a share claim's `score` (a diagnostic's report prefix), or None
    when `score` is not a headline share."""
    from depthlens.diagnostics import registry

    d = registry.by_prefix(score)
    return (d.name, d.headline.key) if d is not None and d.headline is not None else None


def _clean_loss() -> tuple[str, str]:
    """(the diagnostic, its variable) giving the clean loss per sequence a loss-change claim reads, or ("", "")."""
    from depthlens.diagnostics import registry

    found = registry.clean_loss()
    return (found[0].name, found[1]) if found else ("", "")


def _field_owner(field: str) -> str | None:
    """The diagnostic whose report record gives `field` (a claim on a record field: `erank_full`)."""
    from depthlens.diagnostics import registry

    return next((d.name for d in registry.diagnostics() if field in d.record_fields), None)


def claimed(claims: Sequence[Any], *, fields: bool = False) -> tuple[str, ...]:
    """The diagnostics `claims` read, in registry order: each whose headline share a claim names (by its report
    prefix), and the one giving the clean loss per sequence a loss change reads; with `fields`, also each whose
    record gives a field a claim names (the effective rank's `erank_full`, read for its degenerate-map note)."""
    from depthlens.diagnostics import registry

    named = {c.score for c in claims}
    want = {s[0] for s in map(_share, named) if s is not None}
    want |= {_clean_loss()[0]} if "loss_change" in named else set()
    want |= {o for o in map(_field_owner, named) if o is not None} if fields else set()
    return tuple(d.name for d in registry.diagnostics() if d.name in want)


def _runs_of(runs: Runs, design: str, L: int) -> list[tuple[RunKey, Mapping[str, Any]]]:
    return sorted(((k, v) for k, v in runs.items() if k[0] == design and k[1] == L), key=lambda kv: kv[0][2] or 0)


def _n_seq(dss: Sequence[Any]) -> int:
    return min(int(ds.sizes.get("sequence", 0)) for ds in dss) if dss else 0


def share_group(dss: Sequence[Any], score: str, n: int, *, n_boot: int, seed: int) -> cr.Group | None:
    """Per-run share estimates and replicates on the first n sequences (the same resamples for every run)."""
    from depthlens.diagnostics import registry
    from depthlens.diagnostics.sweep import share_interval

    share = _share(score)
    if share is None:
        raise DepthlensError(f"{score!r} is not a headline share")
    key = share[1]
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
    var = _clean_loss()[1]
    y = np.stack([np.asarray(ds[var].values[:n], dtype=np.float64) for ds in dss])
    return cr.Group.of_means(y) if np.isfinite(y).all() and n >= 2 else None


def _groups(
    runs: Runs, claim: Any, n_boot: int, seed: int
) -> tuple[list[cr.Group], list[float], int, list[int]] | None:
    """The groups (and weights) of a claim's contrast: order = higher − lower, sign = L − L/2."""
    share = _share(claim.score)
    if claim.kind == "order" and share is not None:
        metric = share[0]
        cells = [(claim.higher, claim.L), (claim.lower, claim.L)]
    elif claim.kind == "sign" and claim.score == "loss_change" and _clean_loss()[0]:
        metric = _clean_loss()[0]
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
        share_group(p, claim.score, n, n_boot=n_boot, seed=seed) if share is not None else loss_group(p, n) for p in per
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
        owner = _field_owner(c.score) if c.score == "erank_full" else None
        if owner is None:
            continue
        for d in (c.higher, c.lower):
            gains = []
            for _, v in _runs_of(runs, d, c.L):
                ds = v.get(owner)
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


def runs_from_report(directory: str | Path, metrics: Sequence[str] | None = None) -> Runs:
    """A report directory's merged per-checkpoint datasets as a run mapping (design, L, seed) -> {metric: ds},
    seeds from its summary.json records; metrics None = the diagnostics DepthBench's claims read."""
    from depthlens.io.dataset import read_netcdf
    from depthlens.io.files import read_json
    from depthlens.stats.orderings import CLAIMS

    metrics = claimed(CLAIMS, fields=True) if metrics is None else metrics

    d = Path(directory)
    recs = read_json(d / "summary.json", "a report summary", object_only=False)
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
        raise DepthlensError(f"{d / 'summary.json'}: a report summary is a JSON list of records")
    key = {r["checkpoint"]: (r["design"], int(r["n_layer"]), r.get("seed")) for r in recs}
    runs: dict[RunKey, dict[str, Any]] = {}
    for m in metrics:
        for f in sorted(d.glob(f"{m}*.nc")):
            if f.stem != m and not f.stem.startswith(f"{m}_l"):
                continue
            # read whole and closed: a lazily opened file stays open in HDF5 for as long as any selection from it
            # lives, and HDF5 (2.2.0, bundled with netCDF4 1.7.5) segfaults opening a file with string variables
            # when it is open on one handle and another handle on it was closed (HDFGroup/hdf5#3649,
            # Unidata/netcdf-c#2510): `depthlens plan REPORT` segfaulted while an earlier call's runs were alive
            ds = read_netcdf(f)
            for name in ds["checkpoint"].values:
                k = key.get(str(name))
                if k is not None:
                    runs.setdefault(k, {})[m] = ds.sel(checkpoint=name)
    return runs


# The recipe fields that do not make two runs of a cell different training: those the trainer counts as leaving
# the trained model what the recipe defines (`training.outputs.NEUTRAL_OVERRIDES`: where things go, how often to
# log, evaluate and save, `meta`), what makes them seeds of one cell (`seed`, `data_seed`), the run's own `name`
# (every seed has its own), and which analysis snapshots it saved (`snapshot_every_log2`, as `snapshots`).
def _not_a_recipe_difference() -> frozenset[str]:
    from depthlens.training.outputs import NEUTRAL_OVERRIDES

    return NEUTRAL_OVERRIDES | {"seed", "data_seed", "name", "snapshot_every_log2"}


def _flat(recipe: Mapping[str, Any], ignore: frozenset[str], prefix: str = "") -> dict[str, str]:
    """A recipe's fields as dotted names (`model.d_model`) -> a comparable text of the value."""
    import json

    out: dict[str, str] = {}
    for k, v in recipe.items():
        if not prefix and k in ignore:
            continue
        if isinstance(v, Mapping):
            out.update(_flat(v, ignore, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = f"{v:g}" if isinstance(v, float) else json.dumps(v, sort_keys=True)
    return out


def mixed_recipe_rows(runs: Sequence[tuple[RunKey, Mapping[str, Any] | None]]) -> list[dict[str, Any]]:
    """Per (design, depth) cell whose runs were trained from different recipes (train.json `recipe`, apart from the
    fields `_not_a_recipe_difference` names): the fields that differ and which seeds had which values, as one line
    ("preln L=32: seeds 0-2 lr 0.006, seeds 3-7 lr 0.012"). Runs without a recorded recipe are left out; a cell
    whose recipes agree gives no row. Rows carry `"mixed_recipe": true` (orderings notes them beside a verdict)."""
    ignore = _not_a_recipe_difference()
    cells: dict[tuple[str | None, int], list[tuple[int | None, dict[str, str]]]] = {}
    for (design, L, seed), recipe in runs:
        if isinstance(recipe, Mapping) and recipe:
            cells.setdefault((design, L), []).append((seed, _flat(recipe, ignore)))
    out = []
    for (design, L), members in sorted(cells.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        names = sorted({f for _, flat in members for f in flat})
        fields = [f for f in names if len({flat.get(f) for _, flat in members}) > 1]
        if not fields:
            continue
        groups: dict[tuple[str, ...], list[int | None]] = {}
        for seed, flat in members:
            groups.setdefault(tuple(flat.get(f, "(unset)") for f in fields), []).append(seed)
        ordered = sorted(groups.items(), key=lambda kv: min((s for s in kv[1] if s is not None), default=1 << 62))
        line = f"{design} L={L}: " + ", ".join(
            f"{seed_list(seeds)} " + " ".join(f"{f} {v}" for f, v in zip(fields, values)) for values, seeds in ordered
        )
        out.append(
            jsonable(
                {
                    "mixed_recipe": True,
                    "design": design,
                    "L": L,
                    "fields": fields,
                    "groups": [
                        {"seeds": sorted(s, key=lambda x: (x is None, x or 0)), "values": dict(zip(fields, v))}
                        for v, s in ordered
                    ],
                    "line": line,
                }
            )
        )
    return out

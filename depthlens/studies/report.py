"""Compute and assemble a report: checkpoints in, one directory of figures, tables and datasets out.

Steps (`build_report`):

1. `check_out`: refuse an existing output directory (unless overwrite) or an unwritable location, before
   any work is done.
2.-4. a study (`studies.study.run_study`): `load_entries` loads and validates every checkpoint (a bad one
   raises CheckpointError; nothing is written); `study_eval_data` builds one EvalData shared by every
   checkpoint (the held-out split of the offline corpus or `--data`, `n_seq` x `seq_len` tokens, seq_len capped
   at the smallest `max_seq_len` of the set); `compute` runs the applicable diagnostics of the registry on each.
5. `summarise`: the table records (headline shares with bootstrap CIs over sequences, effective rank,
   dead prefix, validation loss, params), threshold sweeps with crossing points, and ranking robustness
   per depth.
6. `write_report` (report.write): everything is written into a hidden temporary directory next to `out`,
   renamed into place at the end; on any failure nothing is left behind.

Under torchrun (WORLD_SIZE > 1: `study.compute_spread`) steps 2-4 run on every rank for its own checkpoints
(runtime.ranks assigns them by estimated cost); rank 0 gathers the computed entries and runs steps 5-6 exactly
as one process does. After each step every rank `agree`s ok/error (runtime.distributed), so a failing rank stops
the run on every rank with its one line and nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.io.atomic import atomic_write_text
from depthlens.io.jsonsafe import finite_or_none as _f
from depthlens.io.jsonsafe import jsonable
from depthlens.io.provenance import command_line
from depthlens.runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ, DEFAULT_SEQ_LEN  # noqa: F401  (as report.build named them)
from depthlens.runtime.evaldata import EvalData
from depthlens.studies.study import (  # noqa: F401  (the study's pieces, as report.build named them)
    Entry,
    Progress,
    StudyOptions,
    _noop,
    compute,
    load_entries,
    metric_data,
    n_steps,
    parse_metrics,
    run_study,
    sort_key,
    study_eval_data,
    tasks,
    tokenizer_facts,
    untrained_model,
)
from depthlens.studies.summaries import UNTRAINED_RECORD_FIELDS, headline_of, record_fields, record_keys
from depthlens.studies.write import check_out, manifest, merged_datasets, write_report  # noqa: F401

if TYPE_CHECKING:
    import xarray as xr

    from depthlens.stats.intervals import Interval

DEAD_PREFIX_EPS = registry.DEAD_PREFIX_EPS
ReportOptions = StudyOptions  # what a report computes is a study's options (one options object for every command)
report_eval_data = study_eval_data


@dataclass
class Report:
    entries: list[Entry]
    options: ReportOptions
    data: Any  # EvalData
    records: list[dict[str, Any]] = field(default_factory=list)
    sweeps: dict[str, Any] = field(default_factory=dict)  # report metric -> xr.Dataset (checkpoint, threshold)
    robustness: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)  # paired design differences (orderings)
    figures: dict[str, str] = field(default_factory=dict)  # cross-checkpoint figures: key -> relative path
    files: dict[str, list[str]] = field(default_factory=dict)  # netCDF file -> checkpoints it holds
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    command: str = ""
    world_size: int = 1  # processes that computed it (torchrun ranks); provenance only, results do not depend on it
    cache_line: str = ""  # how many results came from the result cache (`Study.cache_line`); provenance only


# ---------------------------------------------------------------------------------------------------------------
# 5. summary, sweeps, robustness


RECORD_BASE = (
    "checkpoint",
    "design",
    "design_name",
    "n_layer",
    "d_model",
    "params_total",
    "params_non_embedding",
    "seed",
    "lr",
    "train_git_sha",
    "decay_mixing",
    "val_loss",
    "eval_loss",
    "eval_loss_untrained",
    "untrained_init",
)
# the diagnostics' fields read on the untrained twin (eval_loss_untrained stands in RECORD_BASE), then the path
RECORD_END = (*(f"{k}_untrained" for k in UNTRAINED_RECORD_FIELDS if k != "eval_loss"), "path")
RECORD_KEYS = record_keys(RECORD_BASE, RECORD_END, registry.DIAGNOSTICS)  # shipped; `record` reads the current


def record(e: Entry, opts: ReportOptions, sweeps: dict[str, Any]) -> dict[str, Any]:
    """One table row (JSON-safe; NaN → None): the checkpoint's facts, then every diagnostic's fields
    (`studies.summaries.record_fields`: its headline share and its own), then the share curves' crossings."""
    from depthlens.designs import DESIGNS

    r: dict[str, Any] = {k: None for k in record_keys(RECORD_BASE, RECORD_END)}
    r.update(
        checkpoint=e.name,
        design=e.slug,
        design_name=DESIGNS[e.slug].name if e.slug in DESIGNS else e.slug,
        n_layer=e.n_layer,
        d_model=e.d_model,
        params_total=e.params.get("params_total"),
        params_non_embedding=e.params.get("params_non_embedding"),
        val_loss=_f(e.val_loss),
        path=str(e.path),
        seed=e.seed,
        lr=_f((e.train.get("recipe") or {}).get("lr")),
        train_git_sha=str(e.train["git_sha"])[:12] if e.train.get("git_sha") else None,
        decay_mixing=(e.train.get("recipe") or {}).get("decay_mixing"),
        untrained_init=e.untrained_init,
    )
    base_row: dict[str, Any] = {"n_layer": e.n_layer, "eval_loss": None}  # the untrained model's own row
    for d in registry.diagnostics():
        ds, sw, base = e.datasets.get(d.name), sweeps.get(d.name), e.untrained.get(d.name)
        if ds is not None:
            r.update(record_fields(d, ds, r, opts))
            if base is not None and d.headline:
                r.update(untrained_fields(d, ds, base, opts))
        record = d.loaded().record
        if base is not None and record:
            base_row.update(record(base, base_row))
        if sw is not None and e.name in sw["checkpoint"].values:
            cr = sw["crossing"].sel(checkpoint=e.name)
            r[f"{d.prefix}_theta_50"] = _f(cr.sel(q=0.5).values)
            r[f"{d.prefix}_theta_10"] = _f(cr.sel(q=0.1).values)
    r.update({f"{k}_untrained": base_row.get(k) for k in UNTRAINED_RECORD_FIELDS})
    safe: dict[str, Any] = jsonable(r)
    return safe


def paired_share_difference(a: xr.Dataset, b: xr.Dataset, metric: str, opts: ReportOptions) -> Interval | None:
    """share(a) − share(b) with its paired interval over the eval sequences (`sweep.paired_share_difference`
    with the report's θ, window and resampling seed); None when either has none."""
    from depthlens.diagnostics.sweep import paired_share_difference as paired

    return paired(a, b, metric, start="quarter", n_boot=opts.n_boot, seed=opts.seed)


def untrained_fields(d: registry.Diagnostic, ds: xr.Dataset, base: xr.Dataset, opts: ReportOptions) -> dict[str, Any]:
    """Diagnostic `d`'s headline share on the untrained model, and trained − untrained with its interval
    paired over the sequences the two share, under `<prefix>_*` record keys."""
    assert d.headline is not None
    h = headline_of(base, d.headline.key, n_boot=opts.n_boot, seed=opts.seed)
    out = {
        f"{d.prefix}_share_untrained": _f(h.get("share")) if h else None,
        f"{d.prefix}_untrained_n_seq": int(base.sizes.get("sequence", 0)) or None,
    }
    diff = paired_share_difference(ds, base, d.headline.key, opts)
    if diff is not None:
        out.update(
            {
                f"{d.prefix}_untrained_diff": _f(diff.estimate),
                f"{d.prefix}_untrained_diff_low": _f(diff.low),
                f"{d.prefix}_untrained_diff_high": _f(diff.high),
            }
        )
    return out


def _loss_changes(
    by: dict[tuple[str | None, int, int | None], Entry], design: str, L: int, opts: ReportOptions
) -> list[dict[str, Any]]:
    """Per seed present at L and L/2: eval loss at L minus at L/2, paired over the same eval sequences (the clean
    loss per sequence of the diagnostic `registry.clean_loss()` names)."""
    from depthlens.stats.intervals import bootstrap_counts, mean_interval

    source = registry.clean_loss()  # the diagnostic giving the clean loss per sequence, and its variable
    name, var = (source[0].name, source[1]) if source else ("", "")
    out = []
    for (d, depth, s), deep in by.items():
        shallow = by.get((design, L // 2, s))
        if d != design or depth != L or shallow is None:
            continue
        row: dict[str, Any] = {"score": "loss_change", "higher": design, "lower": None, "L": L, "seed": s}
        for tag, a, b in (("", deep.datasets, shallow.datasets), ("untrained_", deep.untrained, shallow.untrained)):
            if not name or name not in a or name not in b:
                continue
            diff = a[name][var].values - b[name][var].values
            if not np.isfinite(diff).all() or diff.size < 2:
                continue
            it, _ = mean_interval(diff, counts=bootstrap_counts(diff.size, max(opts.n_boot, 2), opts.seed))
            row.update(
                {
                    f"{tag}diff": it.estimate,
                    f"{tag}low": it.low,
                    f"{tag}high": it.high,
                    f"{tag}method": f"paired {it.method}",
                    f"{tag}unit": it.unit,
                }
            )
        out.append(jsonable(row))
    return out


def comparisons(
    entries: Sequence[Entry], opts: ReportOptions, claims: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    """For every ordering claim on a share (report.orderings.CLAIMS): per training seed present in both designs,
    the paired difference higher − lower over the same eval sequences, trained and untrained. The orderings
    pool them over seeds (one seed: this interval, which excludes training variance)."""
    from depthlens.stats.orderings import CLAIMS

    by: dict[tuple[str | None, int, int | None], Entry] = {(e.slug, e.n_layer, e.seed): e for e in entries}
    out = []
    for c in CLAIMS if claims is None else claims:
        if c.kind == "sign" and c.score == "loss_change":
            out += _loss_changes(by, c.higher, c.L, opts)
        owner = registry.by_prefix(c.score)  # a share claim names its diagnostic's prefix ("causal", "perm")
        if owner is None or owner.headline is None:
            continue
        metric, key = owner.name, owner.headline.key
        seeds = sorted(
            {s for (d, L, s) in by if d == c.higher and L == c.L}
            & {s for (d, L, s) in by if d == c.lower and L == c.L},
            key=lambda s: (s is None, s),
        )
        for s in seeds:
            hi, lo = by[(c.higher, c.L, s)], by[(c.lower, c.L, s)]
            row: dict[str, Any] = {"score": c.score, "higher": c.higher, "lower": c.lower, "L": c.L, "seed": s}
            for tag, ga, gb in (("", hi.datasets, lo.datasets), ("untrained_", hi.untrained, lo.untrained)):
                a, b = ga.get(metric), gb.get(metric)
                d = paired_share_difference(a, b, key, opts) if a is not None and b is not None else None
                if d is not None:
                    row.update(
                        {
                            f"{tag}diff": d.estimate,
                            f"{tag}low": d.low,
                            f"{tag}high": d.high,
                            f"{tag}method": d.method,
                            f"{tag}unit": d.unit,
                        }
                    )
            out.append(jsonable(row))
    # the claims' design values and differences over seeds, crossed with the shared eval sequences
    # (studies.claims; orderings reads these rows first), and what a rank-1 readout is
    from depthlens.studies.claims import crossed_rows, degenerate_rows, mixed_recipe_rows

    cl = CLAIMS if claims is None else claims
    out += crossed_rows(
        {k: e.datasets for k, e in by.items()},
        {k: e.untrained for k, e in by.items()},
        cl,
        n_boot=opts.n_boot,
        seed=opts.seed,
    )
    out += degenerate_rows({k: e.datasets for k, e in by.items()}, cl)
    # every checkpoint, not `by` (whose key would merge two checkpoints of one seed): cells pooled over mixed recipes
    out += mixed_recipe_rows([((e.slug, e.n_layer, e.seed), e.train.get("recipe")) for e in entries])
    return out


def sweeps_for(entries: Sequence[Entry], metric: str) -> xr.Dataset | None:
    """S(θ) on the default θ grid and crossing points, window start ⌊L/4⌋, stacked along `checkpoint`
    (with per-checkpoint `design` and `n_layer` coordinates). None when no checkpoint has the metric."""
    import xarray as xr

    from depthlens.diagnostics.sweep import default_thresholds, share_curves

    score = registry.get(metric).headline
    assert score is not None
    key = score.key
    have = [e for e in entries if metric in e.datasets]
    # the default grid plus the headline θ itself (the log grid of P_abs does not contain 0.15), so the
    # ranking and the curves use exactly the headline share of the table
    grid = np.unique(np.concatenate([default_thresholds(key), [score.theta]]))
    parts, names = [], []
    for e in have:
        try:
            sc = share_curves(
                e.datasets[metric],
                key,
                grid,
                starts=("quarter",),
                aggregator=score.select.get("aggregator"),
                variant=score.select.get("variant"),
            )
        except (DepthlensError, ValueError) as err:
            e.notes.append(f"{metric} sweep: not computed ({str(err).splitlines()[0]})")
            continue
        parts.append(sc.squeeze("window_start", drop=True))
        names.append(e.name)
    if not parts:
        return None
    out = xr.concat(
        [p.assign_coords(checkpoint=n) for p, n in zip(parts, names)], dim="checkpoint", combine_attrs="drop_conflicts"
    )
    by = {e.name: e for e in have}
    out = out.assign_coords(
        design=("checkpoint", [by[n].slug for n in names]), n_layer=("checkpoint", [by[n].n_layer for n in names])
    )
    out.attrs.update(
        metric=key,
        headline_threshold=score.theta,
        window_start="quarter",
        Conventions="CF-1.11",
        title=f"depthlens share curves of {key} (late window)",
    )
    return out


def robustness_for(sw: xr.Dataset | None, metric: str) -> list[dict[str, Any]]:
    """Per depth (≥ 2 designs): the reference ranking = designs ordered by their headline share, ties broken
    by the mean of the curve (its integral over the grid, i.e. the mean score); the fraction of the θ grid
    on which that strict ordering holds (`sweep.robustness`), and Kendall τ-b between the shares at each θ
    and the reference ranks (mean and min over the grid; θ where every share ties are skipped)."""
    from depthlens.diagnostics.sweep import robustness
    from depthlens.stats.metrics import kendall_tau

    out: list[dict[str, Any]] = []
    if sw is None:
        return out
    theta = sw["threshold"].values
    h = float(sw.attrs["headline_threshold"])
    hk = int(np.argmin(np.abs(theta - h)))
    design = {str(n): str(d) for n, d in zip(sw["checkpoint"].values, sw["design"].values)}
    for L in sorted(set(int(v) for v in sw["n_layer"].values)):
        names = [str(n) for n, l in zip(sw["checkpoint"].values, sw["n_layer"].values) if int(l) == L]
        vals = {n: np.asarray(sw["share"].sel(checkpoint=n).values, dtype=float) for n in names}
        ok = [n for n in names if np.isfinite(vals[n]).all()]
        if len(ok) < 2:
            continue
        order = sorted(ok, key=lambda n: (vals[n][hk], float(np.mean(vals[n])), n))
        rb = robustness(sw["share"].sel(checkpoint=order), order, headline_threshold=None)
        S = np.stack([vals[n] for n in order])
        ranks = np.arange(len(order), dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            tau = np.array([kendall_tau(S[:, k], ranks) if np.ptp(S[:, k]) > 0 else np.nan for k in range(S.shape[1])])
        fin = tau[np.isfinite(tau)]
        out.append(
            jsonable(
                {
                    "metric": metric,
                    "n_layer": L,
                    "headline_threshold": h,
                    "order": [design[n] for n in order],
                    "order_checkpoints": order,
                    "shares_at_headline": [float(vals[n][hk]) for n in order],
                    "fraction_holds": float(rb["fraction"].values),
                    "kendall_tau_mean": float(fin.mean()) if fin.size else None,
                    "kendall_tau_min": float(fin.min()) if fin.size else None,
                }
            )
        )
    return out


def summarise(entries: Sequence[Entry], data: EvalData, opts: ReportOptions, progress: Progress = _noop) -> Report:
    rep = Report(entries=sorted(entries, key=sort_key), options=opts, data=data)
    for metric in (d.name for d in registry.diagnostics() if d.headline):
        if metric in opts.metrics:
            sw = sweeps_for(rep.entries, metric)
            if sw is not None:
                rep.sweeps[metric] = sw
                rep.robustness += robustness_for(sw, metric)
    for e in rep.entries:
        rep.records.append(record(e, opts, rep.sweeps))
    rep.comparisons = comparisons(rep.entries, opts)
    rep.notes += [mixed_recipe_note(c) for c in rep.comparisons if c.get("mixed_recipe")]
    progress("summary")
    return rep


def mixed_recipe_note(row: dict[str, Any]) -> str:
    """The report's note (and stderr warning) on one cell whose seeds were trained from different recipes."""
    return f"mixed training recipes pooled as the seeds of one design and depth: {row['line']}"


def build_report(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    opts: ReportOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Progress = _noop,
    on_loaded: Callable[[int], None] | None = None,
) -> Report | None:
    """Load, compute, summarise and write a report. `on_loaded(n_steps)` runs once the checkpoints are
    validated (the CLI sizes its progress bar there).

    Steps 1-4 are a study (`studies.study.run_study`, with `check_out` first). Under torchrun (WORLD_SIZE > 1)
    every rank computes whole checkpoints of its own and rank 0 writes the report a single process writes; the
    other ranks return None."""
    opts = opts or ReportOptions()
    with contextlib.ExitStack() as held:  # rank 0 holds the output's lock from the check to the last write
        return _build_report(paths, out, opts, overwrite, progress, on_loaded, held)


def _build_report(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    opts: ReportOptions,
    overwrite: bool,
    progress: Progress,
    on_loaded: Callable[[int], None] | None,
    held: contextlib.ExitStack,
) -> Report | None:
    t_start = time.perf_counter()
    study = run_study(
        paths, opts, before=lambda: check_out(out, overwrite, held), progress=progress, on_loaded=on_loaded
    )
    if study is None:  # a rank other than 0: its checkpoints went to rank 0
        return None
    entries, data, t_compute, world_size = study.entries, study.data, study.seconds, study.world_size
    rep = summarise(entries, data, opts, progress)
    rep.world_size = world_size
    rep.cache_line = study.cache_line()
    rep.command = command_line()
    rep.seconds["compute"] = round(t_compute, 2)
    write_report(rep, out, overwrite, progress)
    for c in rep.comparisons:  # not silent: one line per mixed cell (the claims beside it say so too)
        if c.get("mixed_recipe"):
            sys.stderr.write(f"depthlens: warning: {mixed_recipe_note(c)}\n")
    rep.seconds["total"] = round(time.perf_counter() - t_start, 2)
    # the total is known only after writing; record it in the manifest too (small atomic rewrite)
    atomic_write_text(Path(out) / "manifest.json", json.dumps(manifest(rep), indent=1) + "\n")
    return rep

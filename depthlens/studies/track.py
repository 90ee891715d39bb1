"""Depth utilisation over training: every diagnostic on every snapshot of a run, on the same eval tokens.

    series = scan(["runs/zoo/hc_l16", "runs/zoo/preln_l16"])     # validated, nothing loaded yet
    ds = track(series, TrackOptions(metrics=("causal", "permutation")))

A *series* is either a run directory written by the trainer with snapshots,

    <run>/snapshots/step_0000064/{config.json, model.safetensors, snapshot.json}
    snapshot.json = {"step": 64, "tokens": 131072, "val_loss": 3.21, "run": "hc_l16"}

or checkpoints given in training order (depthlens or Hugging Face directories, GGUF files): the step comes
from a `snapshot.json` next to them or from the name (`step1000`, `step_0000064`, `global_step200`), else
the position in the list.

Refusals (DepthlensError, one line, before anything is computed or written): an empty run directory, a
snapshot whose config differs from the others (mixed architectures), a gap relative to the steps the
recipe requested (`snapshots: [...]` or `snapshot_every_log2`), steps out of order or repeated, tokens that
go backwards, snapshots of different runs in one directory, series with different tokenizers.

The result has dims (run, step[, layer, ...]): headline shares with bootstrap CIs and shard mean/sd per
snapshot (the same `sweep.headline` the other commands print), the score matrices, effective ranks, AttnRes
self-weights and dead prefixes, angular profiles, plus `tokens` and `val_loss` per (run, step).

It is a study over the snapshots (`study.each_computed`: one snapshot in memory at a time, on the eval tokens of
the one eval-set rule), so every per-snapshot engine result goes through the study's result cache
(`studies.cache`, keyed by weights hash, eval data, options and code): a rerun, or a track after new snapshots,
computes only what is new; a changed snapshot, option or depthlens version is recomputed.

Finding and validating the series (`scan`, `Series`, `Snapshot`) is in snapshots.py, re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ
from depthlens.runtime.evaldata import EvalData
from depthlens.studies.snapshots import (  # noqa: F401  (the series scan, re-exported: callers import it from here)
    HF_SIGNATURE,
    SNAPSHOT_DIR,
    SNAPSHOT_JSON,
    SNAPSHOTS,
    STEP_IN_NAME,
    Series,
    Snapshot,
    _fail,
    _read_json,
    describe,
    is_run_dir,
    recipes_in,
    requested_steps,
    scan,
    scan_list,
    scan_run,
    signature,
)
from depthlens.studies.study import StudyOptions, choose_metrics

if TYPE_CHECKING:
    from depthlens.studies.cache import Tally

DEAD_PREFIX_EPS = registry.DEAD_PREFIX_EPS  # the ε of the report's dead-prefix column


def tracked() -> tuple[str, ...]:
    """Names of the tracked diagnostics (`Diagnostic.track_name`: "erank" for rank), in registry order."""
    return tuple(d.track_name for d in registry.diagnostics() if d.tracked)


# ---------------------------------------------------------------------------------------------------------------
# 2. the diagnostics, per snapshot


@dataclass
class TrackOptions:
    """What `track` computes. Defaults match `depthlens report`, so the last step equals a report of the
    final checkpoint."""

    metrics: tuple[str, ...] = field(default_factory=tracked)  # subset of tracked(), in registry order
    data: str | None = None  # eval text/JSONL/shard dir (None: held-out split of the offline corpus)
    n_seq: int = DEFAULT_N_SEQ  # eval sequences (the same tokens for every snapshot of every run)
    seq_len: int | None = None  # tokens per sequence (None: min(128, smallest max_seq_len))
    seed: int = 0  # eval-window draw and bootstrap seed
    n_boot: int = DEFAULT_N_BOOT  # bootstrap resamples over sequences for the share CIs (0 = none)
    batch_size: int | None = None  # max rows per forward (memory knob; results do not depend on it)
    device: str = "cpu"  # where the engines run
    dtype: str = "fp32"  # weights and activations (fp32 | bf16 | fp64)
    window: str = "quarter"  # late-window start of the headline shares
    # the headline θ of each diagnostic's headline share, as `<prefix>_threshold` (summaries.track_theta reads it by
    # the owner's prefix; the run's track.nc records it); the defaults are typed once, in each score's headline.py
    causal_threshold: float = registry.CAUSAL.theta  # on C (max aggregator, current variant)
    perm_threshold: float = registry.PERM_ABS.theta  # on P_abs [nats]
    eps: float = DEAD_PREFIX_EPS  # AttnRes dead-prefix threshold reported per step

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metrics"] = list(self.metrics)
        return d

    def study(self, cache: bool | None = None) -> StudyOptions:
        """The study every snapshot is: these diagnostics (by registry name) with the report's engine options, no
        untrained twin (step 0 is the untrained model), torch's thread count left as the command set it."""
        same = {name: getattr(self, name) for name in _SAME_AS_STUDY}
        metrics = tuple(diagnostic(m).name for m in self.metrics)
        return StudyOptions(**same, metrics=metrics, threads=None, untrained=(), cache=cache)


# the fields a track and its per-snapshot study mean the same by (the eval set and the engines' run settings)
_SAME_AS_STUDY = ("data", "n_seq", "seq_len", "seed", "device", "dtype", "n_boot", "batch_size")


def parse_metrics(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'causal,erank' (registry aliases too: perm, rank, ...) → the registry-order tuple of tracked names."""
    return choose_metrics(spec, tracked(), _track_name)


def _track_name(name: str) -> str:
    try:
        return registry.get(name).track_name
    except DepthlensError:
        return name


def diagnostic(metric: str) -> registry.Diagnostic:
    return registry.get(metric)  # a track name is a registry name or alias ("erank" of "rank")


def applies(metric: str, slug: str) -> bool:
    """erank: multi-stream designs; attnres: depth-softmax designs (the registry's capability flags)."""
    return diagnostic(metric).applies(slug)


# ---------------------------------------------------------------------------------------------------------------
# 3. per-snapshot summaries


def summarise(ds: xr.Dataset, metric: str, opts: TrackOptions) -> dict[str, xr.DataArray]:
    """The per-step variables `track` keeps from one engine result (no `step` dim yet): the diagnostic's
    `track` hook, or its headline share (`studies.summaries.track_vars`)."""
    from depthlens.studies.summaries import track_vars

    return track_vars(diagnostic(metric), ds, opts)


# ---------------------------------------------------------------------------------------------------------------
# 4. the whole series


Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def eval_tokens(series: Sequence[Series], opts: TrackOptions) -> EvalData:
    """One EvalData for every snapshot of every series, by the one eval-set rule of every study
    (`study.study_eval_data`) over the first snapshot of each series: one tokenizer for all of them, seq_len =
    min(128, the smallest max_seq_len) unless given, checked against each model."""
    from depthlens.studies.api import load_model
    from depthlens.studies.study import Loaded, study_eval_data

    firsts = [Loaded(s.snapshots[0].path, load_model(s.snapshots[0].path, device=opts.device)[0]) for s in series]
    return study_eval_data(firsts, opts.study())


def change_from_init(
    first: Mapping[str, xr.Dataset], last: Mapping[str, xr.Dataset], opts: TrackOptions
) -> dict[str, xr.DataArray]:
    """Last snapshot minus the step-0 (untrained) one for each headline share, with its 95 % interval paired
    over the eval sequences (`sweep.paired_share_difference`): what training changed."""
    from depthlens.diagnostics.sweep import paired_share_difference
    from depthlens.io.dataset import scalar_var
    from depthlens.studies.summaries import track_theta

    out = {}
    for diag in registry.diagnostics():
        metric, prefix = diag.name, diag.prefix
        if diag.headline is None or metric not in first or metric not in last:
            continue
        key = diag.headline.key
        try:
            d = paired_share_difference(
                last[metric],
                first[metric],
                key,
                track_theta(opts, key),
                start=opts.window,
                n_boot=opts.n_boot,
                seed=opts.seed,
            )
        except (DepthlensError, ValueError):
            d = None
        label = f"{prefix} share, last snapshot minus step 0 (untrained)"
        out[f"{prefix}_change"] = scalar_var(None if d is None else d.estimate, label)
        out[f"{prefix}_change_low"] = scalar_var(None if d is None else d.low, f"{label}: 95% interval low")
        out[f"{prefix}_change_high"] = scalar_var(None if d is None else d.high, f"{label}: 95% interval high")
        if d is not None:
            out[f"{prefix}_change"].attrs.update(interval_method=d.method, interval_unit=d.unit)
    return out


def series_dataset(s: Series, per_step: Sequence[dict[str, xr.DataArray]]) -> xr.Dataset:
    """Stack one series' per-step summaries along `step` and add tokens / val_loss."""
    steps = [sn.step for sn in s.snapshots]
    names = list(dict.fromkeys(k for row in per_step for k in row))
    data = {}
    for k in names:
        rows = [row.get(k) for row in per_step]
        proto = next(r for r in rows if r is not None)
        filled = [r if r is not None else xr.full_like(proto, np.nan, dtype=float) for r in rows]
        data[k] = xr.concat(filled, dim="step", join="outer", combine_attrs="override")
    ds = xr.Dataset(data).assign_coords(step=steps)
    ds["val_loss"] = (
        "step",
        [sn.val_loss for sn in s.snapshots],
        {"long_name": "validation loss at the snapshot (trainer)", "units": "nat"},
    )
    ds["tokens"] = ("step", [sn.tokens for sn in s.snapshots], {"long_name": "training tokens seen", "units": "1"})
    ds["snapshot"] = ("step", [str(sn.path) for sn in s.snapshots], {"long_name": "snapshot path", "units": "1"})
    return ds


def track(
    series: Sequence[Series],
    opts: TrackOptions,
    ev: EvalData | None = None,
    progress: Progress = _noop,
    *,
    cache: bool | None = None,
    tally: Tally | None = None,
) -> xr.Dataset:
    """Run the requested diagnostics on every snapshot of every series → one Dataset (run, step, ...): a study
    over the snapshots (`study.each_computed`), each result from the result cache when it holds it (`cache`:
    `StudyOptions.cache`; `tally` counts where the results came from)."""
    from depthlens.io.dataset import depthlens_version, make_dataset
    from depthlens.studies.study import applies as study_applies
    from depthlens.studies.study import each_computed, results_of

    ev = ev if ev is not None else eval_tokens(series, opts)
    study = opts.study(cache)
    parts, designs, depths, notes = [], [], [], []
    for s in series:
        rows, slugs, ends = [], set(), []
        snapshots = each_computed([sn.path for sn in s.snapshots], ev, study, progress)
        for k, e in enumerate(snapshots):
            refused = [n for n in e.notes if n.split(":")[0] in study.metrics]
            if refused:  # a requested diagnostic that does not run on a snapshot: refused, never a gap in the series
                raise DepthlensError(f"{e.path}: {refused[0]}")
            for m in opts.metrics:  # one progress step per metric, so counts match len(metrics) per snapshot
                if not study_applies(diagnostic(m).name, e):
                    progress(f"{e.name}: {m} (not applicable)")
            if tally is not None:
                tally.add(*results_of(e))
            results = {m: e.datasets[diagnostic(m).name] for m in opts.metrics if diagnostic(m).name in e.datasets}
            slugs.add((e.slug, e.n_layer))
            rows.append({k: v for m, ds in results.items() for k, v in summarise(ds, m, opts).items()})
            if k in (0, len(s.snapshots) - 1):
                ends.append(results)
        if len(slugs) > 1:
            raise _fail(f"{s.source}: mixed architectures in one series ({sorted(slugs)})")
        slug, L = slugs.pop()
        skipped = [m for m in opts.metrics if not applies(m, slug)]
        if skipped:
            notes.append(f"{s.name}: {', '.join(skipped)} not defined for {slug}")
        for d in (diagnostic(m) for m in opts.metrics):
            var = f"{d.prefix}_share"
            if d.headline and any(not np.isfinite(float(r[var])) for r in rows if var in r):
                notes.append(f"{s.name}: no {d.name} share at some steps (fewer than 2 layers in the late window)")
        part = series_dataset(s, rows)
        if len(s.snapshots) > 1 and s.snapshots[0].step == 0:
            part = part.assign(change_from_init(ends[0], ends[-1], opts))
        parts.append(part.expand_dims(run=[s.name]))
        designs.append(slug)
        depths.append(L)
    merged = xr.merge(parts, join="outer", compat="no_conflicts", combine_attrs="override")
    merged = merged.reindex(run=[s.name for s in series]).sortby("step")  # input order, steps ascending
    coords = {
        "design": ("run", designs),
        "n_layer": ("run", depths),
        "run_source": ("run", [s.source for s in series]),
        "requested_steps": ("run", [json.dumps(s.requested) for s in series]),
        "step_kind": ("run", [s.step_kind for s in series]),
    }
    merged["snapshot"] = merged["snapshot"].fillna("").astype(str)  # steps a run does not have: ""
    data_vars = {k: merged[k] for k in merged.data_vars if k not in ("tokens",)}
    out = make_dataset(
        cast("dict[str, xr.DataArray]", data_vars),  # the variables are named by str keys (summaries)
        cast("dict[str, Any]", {**{k: merged.coords[k] for k in merged.coords}, "tokens": merged["tokens"], **coords}),
        metric="track",
        title="depthlens depth over training",
        options={**opts.as_dict(), "notes": notes or None},
        provenance={
            **ev.provenance(),
            "depthlens_version": depthlens_version(),
            "series": [
                {
                    "run": s.name,
                    "source": s.source,
                    "snapshots": len(s.snapshots),
                    "requested_from": s.requested_from,
                    "pending": s.pending,
                }
                for s in series
            ],
        },
    )
    out["step"].attrs.update(long_name="optimizer step of the snapshot", units="1")
    out["tokens"].attrs.update(long_name="training tokens seen", units="1")
    return out

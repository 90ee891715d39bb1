"""Depth utilisation over training: every diagnostic on every snapshot of a run, on the same eval tokens.

    series = scan(["runs/zoo/hc_l16", "runs/zoo/preln_l16"])     # validated, nothing loaded yet
    ds = track(series, TrackOptions(metrics=("causal", "permutation")), cache="out/parts")

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
self-weights and dead prefixes, angular profiles, plus `tokens` and `val_loss` per (run, step). Every
per-snapshot engine result is cached as netCDF under `cache` keyed by (weights hash, eval-token hash,
metric options): a rerun skips what is done, a changed snapshot or option is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import xarray as xr

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError, UsageError
from depthlens.runtime.evaldata import DEFAULT_N_SEQ, DEFAULT_SEQ_LEN

SNAPSHOTS = "snapshots"
SNAPSHOT_JSON = "snapshot.json"
SNAPSHOT_DIR = re.compile(r"^step_(\d+)$")
STEP_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:global_)?step[_-]?0*(\d+)", re.IGNORECASE)
DEAD_PREFIX_EPS = registry.DEAD_PREFIX_EPS  # the ε of the report's dead-prefix column


def tracked() -> tuple[str, ...]:
    """Names of the tracked diagnostics (`Diagnostic.track_name`: "erank" for rank), in registry order."""
    return tuple(d.track_name for d in registry.diagnostics() if d.tracked)


# of the shipped registry: causal, permutation, erank, attnres, angular
METRICS = tuple(d.track_name for d in registry.DIAGNOSTICS if d.tracked)
HF_SIGNATURE = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "n_layer",
    "n_embd",
    "n_head",
)


def _fail(msg: str) -> DepthlensError:
    return DepthlensError(msg)


# ---------------------------------------------------------------------------------------------------------------
# 1. series: discover and validate (configs and JSON only; no weights are read)


@dataclass(frozen=True)
class Snapshot:
    path: Path  # checkpoint directory or GGUF file
    step: int  # optimizer steps done when it was written (or the list position for unnamed checkpoints)
    tokens: float  # training tokens seen (NaN when unknown)
    val_loss: float  # validation loss at that step (NaN when unknown)


@dataclass
class Series:
    name: str  # the `run` coordinate
    source: str  # the run directory, or "list" for checkpoints given in order
    snapshots: list[Snapshot]
    signature: dict[str, Any]  # architecture identity shared by every snapshot (from config.json)
    requested: list[int] | None = None  # steps the recipe asked for (None: unknown)
    requested_from: str = ""  # where `requested` was read
    step_kind: str = "optimizer step"  # or "position in the list" when no step is known

    @property
    def pending(self) -> list[int]:
        """Requested steps after the last snapshot: the run is still training (or was stopped)."""
        last = self.snapshots[-1].step
        return [s for s in (self.requested or []) if s > last]


def requested_steps(recipe: Mapping[str, Any]) -> list[int] | None:
    """The snapshot steps a recipe asks for (`snapshots: [...]` and/or `snapshot_every_log2: true`), by the
    trainer's own rule `RunConfig.snapshot_steps` applied to those fields (a full RunConfig would also need
    every other field valid); None if it asks for none or does not say how many steps it trains."""
    from depthlens.training.config import RunConfig

    if not (recipe.get("snapshots") or recipe.get("snapshot_every_log2")) or recipe.get("steps") is None:
        return None
    fields = SimpleNamespace(
        snapshots=[int(s) for s in recipe.get("snapshots") or []],
        steps=int(recipe["steps"]),
        snapshot_every_log2=bool(recipe.get("snapshot_every_log2")),
    )
    return list(RunConfig.snapshot_steps.fget(fields))


def _read_json(path: Path) -> dict[str, Any]:
    from depthlens.io.files import read_json

    try:
        return read_json(path, "a training record")
    except DepthlensError as e:
        raise _fail(str(e)) from None


def _number(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


def _snapshot_record(d: Path) -> dict[str, Any]:
    from depthlens.io.records import check_snapshot_record

    try:
        return check_snapshot_record(_read_json(d / SNAPSHOT_JSON), d / SNAPSHOT_JSON)
    except ValueError as e:  # SchemaError: one line naming the file and the field
        raise _fail(str(e)) from None


def is_run_dir(path: Path) -> bool:
    return (
        path.is_dir()
        and (path / SNAPSHOTS).is_dir()
        or (path.name == SNAPSHOTS and path.is_dir() and not (path / "config.json").exists())
    )


def recipes_in(path: Path) -> dict[str, dict[str, Any]]:
    """Run name → RunConfig fields, from a recipe (one run or a grid) or a checkpoint's train.json (the
    recipe the run was really trained with, overrides included)."""
    from depthlens.training.config import read_recipe, recipe_runs

    try:
        data = read_recipe(path)
        if isinstance(data.get("recipe"), dict):
            return {str(data["recipe"].get("name") or data.get("name") or ""): data["recipe"]}
        if "runs" not in data and not data.get("name"):
            return {"": recipe_runs(data, path).popitem()[1]}  # a single run that names no run: applies to every run
        return recipe_runs(data, path)
    except (DepthlensError, ValueError) as e:
        raise _fail(str(e)) from None


def _run_recipe(
    run: Path, run_name: str, recipes: Sequence[Path], snap_dirs: Sequence[Path]
) -> tuple[dict[str, Any] | None, str]:
    """The run's recipe (RunConfig fields): the first of `recipes` (--recipe) that names the run (or names no
    run at all), else the train.json of the run's final export or of a snapshot, else the resume state's
    trajectory."""
    if recipes:
        for p in recipes:
            runs = recipes_in(p)
            if run_name in runs or "" in runs:
                return runs.get(run_name, runs.get("")), str(p)
        raise _fail(f"no --recipe names the run {run_name!r} ({run})")
    for cand in [run / "checkpoint" / "train.json", *(d / "train.json" for d in reversed(snap_dirs))]:
        if cand.is_file():
            from depthlens.io.records import check_train_record

            try:
                rec = check_train_record(_read_json(cand), cand).get("recipe")
            except ValueError as e:
                raise _fail(str(e)) from None
            if isinstance(rec, dict):
                return rec, str(cand)
    state = run / "resume" / "state.json"
    if state.is_file():
        traj = _read_json(state).get("trajectory")
        if isinstance(traj, dict):
            return traj, str(state)
    return None, ""


def _depthlens_signature(path: Path) -> dict[str, Any]:
    from depthlens.io.checkpoint import read_config

    try:
        cfg = read_config(path).resolved().to_dict()
    except Exception as e:  # noqa: BLE001 - CheckpointError / ValueError from a broken config, one line
        raise _fail(str(e).splitlines()[0]) from None
    return {"kind": "depthlens", **cfg}


def signature(path: Path) -> dict[str, Any]:
    """Architecture identity of one checkpoint from its config (a GGUF file is loaded to learn it)."""
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise _fail(f"{path}: not a checkpoint (no config.json)")
        raw = _read_json(cfg_path)
        if isinstance(raw.get("model"), dict) or "depthlens_version" in raw:
            return _depthlens_signature(path)
        if "model_type" in raw:
            return {"kind": "hf", **{k: raw[k] for k in HF_SIGNATURE if k in raw}}
        raise _fail(f"{cfg_path}: neither a depthlens nor a Hugging Face config")
    if path.is_file():
        from depthlens.adapters.load import gguf_header

        head = gguf_header(path)  # a GGUF file: its header, nothing dequantised
        return {"kind": "gguf", "architecture": head["architecture"], "n_layer": head["n_layer"]}
    raise _fail(f"{path}: no such file or directory")


def describe(sig: Mapping[str, Any]) -> str:
    if sig.get("kind") == "depthlens":
        return f"{sig.get('arch')} L={sig.get('n_layer')} d={sig.get('d_model')}"
    if sig.get("kind") == "hf":
        return (
            f"{sig.get('model_type')} L={sig.get('num_hidden_layers', sig.get('n_layer'))} "
            f"d={sig.get('hidden_size', sig.get('n_embd'))}"
        )
    return f"{sig.get('architecture')} L={sig.get('n_layer')}"


def _check_same_arch(paths: Sequence[Path], sigs: Sequence[dict[str, Any]], where: str) -> dict[str, Any]:
    for p, s in zip(paths[1:], sigs[1:]):
        if s != sigs[0]:
            diff = sorted(k for k in set(s) | set(sigs[0]) if s.get(k) != sigs[0].get(k))
            raise _fail(
                f"{where}: mixed architectures in one series: {paths[0].name} is {describe(sigs[0])}, "
                f"{p.name} is {describe(s)} (differs in {', '.join(diff[:4])})"
            )
    return sigs[0]


def _check_order(snaps: Sequence[Snapshot], where: str) -> None:
    for a, b in zip(snaps, snaps[1:]):
        if b.step <= a.step:
            raise _fail(
                f"{where}: steps must increase: {b.path.name} (step {b.step}) comes after {a.path.name} (step {a.step})"
            )
        if np.isfinite(a.tokens) and np.isfinite(b.tokens) and b.tokens < a.tokens:
            raise _fail(f"{where}: tokens go backwards: {b.path.name} has {b.tokens:.0f} < {a.tokens:.0f}")


def scan_run(run: Path, recipes: Sequence[Path] = ()) -> Series:
    """One trainer run directory (or its `snapshots/` folder) → a validated Series."""
    run = run.parent if run.name == SNAPSHOTS and not (run / SNAPSHOTS).is_dir() else run
    root = run / SNAPSHOTS
    found = sorted(
        (
            (int(m.group(1)), d)
            for d in (root.iterdir() if root.is_dir() else [])
            if d.is_dir() and (m := SNAPSHOT_DIR.match(d.name))
        ),
        key=lambda t: t[0],
    )
    if not found:
        raise _fail(
            f"{run}: no snapshots (expected {root}/step_*/; train with `snapshot_every_log2: true` "
            "or `snapshots: [...]` in the recipe)"
        )
    snaps, names = [], set()
    for step, d in found:
        if not (d / SNAPSHOT_JSON).is_file():
            raise _fail(f"{d}: missing {SNAPSHOT_JSON} (not a trainer snapshot)")
        rec = _snapshot_record(d)
        if rec["step"] != step:
            raise _fail(f"{d / SNAPSHOT_JSON}: step {rec['step']} does not match the directory name")
        names.add(str(rec.get("run", "")))
        snaps.append(Snapshot(d, step, _number(rec.get("tokens")), _number(rec.get("val_loss"))))
    if len(names) > 1:
        raise _fail(f"{root}: snapshots of different runs in one directory ({', '.join(sorted(names))})")
    name = names.pop() or run.name
    _check_order(snaps, str(root))
    sig = _check_same_arch([s.path for s in snaps], [signature(s.path) for s in snaps], str(root))
    cfg, source = _run_recipe(run, name, recipes, [s.path for s in snaps])
    req = requested_steps(cfg) if cfg is not None else None
    if req is not None:
        have = [s.step for s in snaps]
        extra = [s for s in have if s not in req]
        if extra:
            raise _fail(f"{root}: snapshot at step {extra[0]} was not requested by the recipe ({source})")
        missing = [s for s in req if s <= have[-1] and s not in have]
        if missing:
            raise _fail(f"{root}: gap in steps: step {missing[0]} requested by the recipe ({source}) has no snapshot")
    return Series(name=name, source=str(run), snapshots=snaps, signature=sig, requested=req, requested_from=source)


def scan_list(paths: Sequence[Path], name: str, tokens_per_step: float | None = None) -> Series:
    """Checkpoints given in training order (directories or GGUF files) → a validated Series."""
    steps: list[int | None] = []
    records: list[dict[str, Any]] = []
    for p in paths:
        if not p.exists():
            raise _fail(f"{p}: no such file or directory")
        rec = _snapshot_record(p) if p.is_dir() and (p / SNAPSHOT_JSON).is_file() else {}
        m = STEP_IN_NAME.search(p.stem if p.is_file() else p.name)
        steps.append(rec["step"] if rec else (int(m.group(1)) if m else None))
        records.append(rec)
    known = [s is not None for s in steps]
    if any(known) and not all(known):
        bad = paths[known.index(False)]
        raise _fail(f"{bad}: no step in its name or snapshot.json while the others have one")
    kind = "optimizer step" if all(known) else "position in the list"
    snaps = []
    for k, (p, s, rec) in enumerate(zip(paths, steps, records)):
        step = s if s is not None else k + 1
        tokens = (
            _number(rec.get("tokens"))
            if "tokens" in rec
            else (step * tokens_per_step if tokens_per_step and s is not None else float("nan"))
        )
        snaps.append(Snapshot(p, step, tokens, _number(rec.get("val_loss"))))
    _check_order(snaps, "checkpoint list")
    sig = _check_same_arch(list(paths), [signature(p) for p in paths], "checkpoint list")
    return Series(name=name, source="list", snapshots=snaps, signature=sig, step_kind=kind)


def scan(
    paths: Sequence[str | os.PathLike],
    *,
    recipes: Sequence[str | os.PathLike] = (),
    name: str | None = None,
    tokens_per_step: float | None = None,
) -> list[Series]:
    """Every run directory is its own series; checkpoints given directly form one series, in order."""
    if not paths:
        raise _fail("give at least one run directory or checkpoint")
    runs, loose = [], []
    for p in map(Path, paths):
        if is_run_dir(p):
            runs.append(scan_run(p, [Path(r) for r in recipes]))
        elif p.is_file() or (p / "config.json").is_file():
            loose.append(p)
        elif p.is_dir():
            raise _fail(f"{p}: no snapshots (expected {p}/snapshots/step_*/) and not a checkpoint")
        else:
            raise _fail(f"{p}: no such file or directory")
    if loose:
        runs.append(scan_list(loose, name or _common_name(loose), tokens_per_step))
    names = [s.name for s in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(f"two series are both named {dup[0]!r}; track them separately or rename one")
    return runs


def _common_name(paths: Sequence[Path]) -> str:
    parents = {p.resolve().parent.name for p in paths}
    return parents.pop() if len(parents) == 1 else "series"


# ---------------------------------------------------------------------------------------------------------------
# 2. the diagnostics, per snapshot, cached


@dataclass
class TrackOptions:
    """What `track` computes. Defaults match `depthlens report`, so the last step equals a report of the
    final checkpoint."""

    metrics: tuple[str, ...] = field(default_factory=tracked)  # subset of tracked(), in registry order
    data: str | None = None  # eval text/JSONL/shard dir (None: held-out split of the offline corpus)
    n_seq: int = DEFAULT_N_SEQ  # eval sequences (the same tokens for every snapshot of every run)
    seq_len: int | None = None  # tokens per sequence (None: min(128, smallest max_seq_len))
    seed: int = 0  # eval-window draw and bootstrap seed
    n_boot: int = 1000  # bootstrap resamples over sequences for the share CIs (0 = none)
    batch_size: int | None = None  # max rows per forward (memory knob; results do not depend on it)
    device: str = "cpu"  # where the engines run
    dtype: str = "fp32"  # weights and activations (fp32 | bf16 | fp64); part of the cache key unless fp32
    window: str = "quarter"  # late-window start of the headline shares
    causal_threshold: float = registry.score("causal").theta  # headline θ on C (max aggregator, current variant)
    perm_threshold: float = registry.score("perm_abs").theta  # headline θ on P_abs [nats]
    eps: float = DEAD_PREFIX_EPS  # AttnRes dead-prefix threshold reported per step

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metrics"] = list(self.metrics)
        return d


def parse_metrics(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'causal,erank' (registry aliases too: perm, rank, ...) → the registry-order tuple of tracked names."""
    every = tracked()
    names = [_track_name(s.strip()) for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    bad = [n for n in names if n not in every]
    if bad or not names:
        raise UsageError(
            f"--metrics: unknown {', '.join(map(repr, bad))}; choose from {','.join(every)}"
            if bad
            else f"--metrics: give at least one of {','.join(every)}"
        )
    return tuple(m for m in every if m in names)


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


def engine_options(metric: str) -> dict[str, Any]:
    """The options `metric`'s engine runs with: the same as `depthlens report` (ReportOptions.engine_options)."""
    return dict(diagnostic(metric).report_opts)


def weights_id(path: Path) -> str:
    """SHA-256 of what a checkpoint's results depend on: config + weights (a GGUF file: the file)."""
    from depthlens.io.dataset import checkpoint_sha256, sha256_file

    if path.is_file():
        return sha256_file(path)
    files = ["config.json", *sorted(p.name for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf"))]
    return checkpoint_sha256(path, files)


def cache_key(wid: str, eval_sha: str, metric: str, opts: Mapping[str, Any]) -> str:
    blob = json.dumps(
        {"weights": wid, "eval": eval_sha, "metric": metric, "options": opts}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _discard(path: Path) -> None:
    """Remove a cache part that `_cached` rejected (truncated, foreign, or for other options): the cache
    directory is ours (its marker was checked by `track`), so the part is recomputed instead of refused."""
    if path.is_file() and not path.is_symlink():
        path.unlink()


def _cached(path: Path, key: str) -> xr.Dataset | None:
    if not path.is_file():
        return None
    try:
        ds = xr.load_dataset(path, engine="netcdf4")
    except (OSError, ValueError):
        return None  # a foreign or damaged file: recompute and replace it
    return ds if ds.attrs.get("track_key") == key else None


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


def eval_tokens(series: Sequence[Series], opts: TrackOptions):
    """One EvalData for every snapshot of every series (same tokenizer required), built from the first
    snapshot; seq_len = min(128, the smallest max_seq_len) unless given."""
    from depthlens.studies.api import _tokenizer_for, eval_data_for, load_model

    names = {}
    for s in series:  # the first snapshot of each series: its tokenizer as the loader found it
        m, c = load_model(s.snapshots[0].path, device=opts.device)
        tok = _tokenizer_for(c, m)
        names[s.name] = str(getattr(tok, "name", tok))
        if len(set(names.values())) > 1:
            raise _fail(
                f"the series use different tokenizers ({', '.join(f'{k}: {v}' for k, v in names.items())}); "
                "one eval set needs one tokenizer: track them separately"
            )
    model, ck = load_model(series[0].snapshots[0].path, device=opts.device)
    max_lens = [s.signature.get("max_seq_len") for s in series]
    max_lens = [int(m) for m in max_lens if isinstance(m, int)]
    own = getattr(getattr(model, "config", None), "max_seq_len", None)
    max_lens += [int(own)] if own else [DEFAULT_SEQ_LEN]
    T = opts.seq_len or min(DEFAULT_SEQ_LEN, min(max_lens))
    return eval_data_for(model, opts.data, ck, n_seq=opts.n_seq, seq_len=T, seed=opts.seed)


def analyse(
    snap: Snapshot, metrics: Sequence[str], ev, opts: TrackOptions, cache: Path, progress: Progress = _noop
) -> tuple[dict[str, xr.Dataset], str, int]:
    """Engine results of one snapshot (from the cache when its key matches), its design slug and L.
    Computes only what is missing; each result is written to the cache atomically as soon as it exists."""
    from depthlens.io.dataset import write_netcdf

    cache.mkdir(parents=True, exist_ok=True)
    wid = weights_id(snap.path)
    stem = f"step_{snap.step:07d}"
    meta_path = cache / f"{stem}.json"
    meta = _read_json(meta_path) if meta_path.is_file() else {}
    out: dict[str, xr.Dataset] = {}
    todo = []
    if meta.get("weights") == wid:  # slug and L known without loading the model
        slug, L = str(meta["design"]), int(meta["n_layer"])
        for m in metrics:
            if not applies(m, slug):
                continue
            ds = _cached(cache / f"{stem}.{m}.nc", cache_key(wid, ev.sha256, m, _metric_opts(m, opts)))
            if ds is None:
                todo.append(m)
            else:
                out[m] = ds
        if not todo:
            for m in metrics:  # one progress step per metric, done or not, so counts match len(metrics) per snapshot
                progress(f"{snap.path.name}: {m} (cached)")
            return out, slug, L
    from depthlens.studies.api import load_model

    model, _ = load_model(snap.path, device=opts.device, dtype=registry.load_dtype(opts.dtype))
    slug, L = str(getattr(model.design, "slug", "?")), int(model.n_layer)
    cfg = getattr(model, "config", None)
    ev.check_model(getattr(cfg, "vocab_size", None), getattr(cfg, "max_seq_len", None))
    from depthlens.io.atomic import atomic_write_text

    atomic_write_text(meta_path, json.dumps({"weights": wid, "design": slug, "n_layer": L, "path": str(snap.path)}))
    import torch

    for m in metrics:
        if m in out or not applies(m, slug):
            progress(f"{snap.path.name}: {m} ({'cached' if m in out else 'not applicable'})")
            continue
        key = cache_key(wid, ev.sha256, m, _metric_opts(m, opts))
        ds = _cached(cache / f"{stem}.{m}.nc", key)
        if ds is None:
            _discard(cache / f"{stem}.{m}.nc")  # a stale or damaged part of our own cache: recomputed, replaced
            with torch.no_grad():  # the registry is the one dispatch path (as for report, API and CLI)
                ds = registry.run(
                    diagnostic(m).name, model, ev, checkpoint=snap.path, batch_size=opts.batch_size, **engine_options(m)
                )
            ds.attrs["track_key"] = key
            write_netcdf(ds, cache / f"{stem}.{m}.nc", overwrite=True)
        progress(f"{snap.path.name}: {m}")
        out[m] = ds
    return out, slug, L


def _metric_opts(metric: str, opts: TrackOptions) -> dict[str, Any]:
    # batch_size does not change results: not in the key; a non-default dtype does (fp32 keys stay as they were)
    return {**engine_options(metric), "batch_size": None, **({} if opts.dtype == "fp32" else {"dtype": opts.dtype})}


def change_from_init(
    first: Mapping[str, xr.Dataset], last: Mapping[str, xr.Dataset], opts: TrackOptions
) -> dict[str, xr.DataArray]:
    """Last snapshot minus the step-0 (untrained) one for each headline share, with its 95 % interval paired
    over the eval sequences (`sweep.paired_share_difference`): what training changed."""
    from depthlens.diagnostics.sweep import paired_share_difference
    from depthlens.studies.summaries import _scalar, track_theta

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
        out[f"{prefix}_change"] = _scalar(None if d is None else d.estimate, label)
        out[f"{prefix}_change_low"] = _scalar(None if d is None else d.low, f"{label}: 95% interval low")
        out[f"{prefix}_change_high"] = _scalar(None if d is None else d.high, f"{label}: 95% interval high")
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
        rows = [r if r is not None else xr.full_like(proto, np.nan, dtype=float) for r in rows]
        data[k] = xr.concat(rows, dim="step", join="outer", combine_attrs="override")
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
    series: Sequence[Series], opts: TrackOptions, cache: str | os.PathLike, ev=None, progress: Progress = _noop
) -> xr.Dataset:
    """Run the requested diagnostics on every snapshot of every series → one Dataset (run, step, ...)."""
    from depthlens.io.atomic import claim_dir
    from depthlens.io.dataset import depthlens_version, make_dataset

    cache = claim_dir(cache, "track cache")  # a directory of ours (marker), so damaged parts may be replaced
    ev = ev if ev is not None else eval_tokens(series, opts)
    parts, designs, depths, notes = [], [], [], []
    for s in series:
        rows, slugs, ends = [], set(), []
        for k, snap in enumerate(s.snapshots):
            results, slug, L = analyse(snap, opts.metrics, ev, opts, cache / _safe(s.name), progress)
            slugs.add((slug, L))
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
        data_vars,
        {**{k: merged.coords[k] for k in merged.coords}, "tokens": merged["tokens"], **coords},
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


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "run"

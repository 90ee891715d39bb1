"""Compute and assemble a report: checkpoints in, one directory of figures, tables and datasets out.

Steps (`build_report`):

1. `check_out`: refuse an existing output directory (unless overwrite) or an unwritable location, before
   any work is done.
2. `load_entries`: load and validate every checkpoint (a bad one raises CheckpointError; nothing is written).
3. `report_eval_data`: one EvalData shared by every checkpoint (built once, as `api.compare` does):
   the held-out split of the offline corpus (or `--data`), `n_seq` x `seq_len` tokens, seq_len capped at
   the smallest `max_seq_len` of the set.
4. `compute`: for every checkpoint the applicable diagnostics (`registry`): causal (current variant, every
   layer skipped), permutation (late pairs), angular, depth mixing, effective rank (HC/mHC) and
   AttnRes self-weights (Full/Block AttnRes).
5. `summarise`: the table records (headline shares with bootstrap CIs over sequences, effective rank,
   dead prefix, validation loss, params), threshold sweeps with crossing points, and ranking robustness
   per depth.
6. `write_report`: everything is written into a hidden temporary directory next to `out`, which is renamed
   into place at the end (the old report, with overwrite, is swapped out and removed only then). Every file
   inside is written atomically too (temp then rename). On any failure nothing is left behind.

Under torchrun (`build_report` when WORLD_SIZE > 1: `compute_spread`) steps 2-4 run on every rank for its own
checkpoints (report.ranks assigns them by estimated cost); rank 0 gathers the computed entries and runs steps
5-6 exactly as one process does. After each step every rank `agree`s ok/error (analysis.distributed), so a
failing rank stops the run on every rank with its one line and nothing is written.

Merged netCDF files: the per-checkpoint Datasets of one metric are concatenated along `checkpoint` only
within groups of identical dimensions and index coordinates (in practice: the same depth L; AttnRes also
splits by design, since Full and Block AttnRes have different sources). One group → `<metric>.nc`;
several → `<metric>_l<L>.nc` (plus `_<design>` when one depth holds several shapes). `manifest.json`
lists which checkpoints each file holds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from depthlens.analysis import registry
from depthlens.errors import DepthlensError
from depthlens.io.atomic import atomic_dir, atomic_write_text, recover
from depthlens.io.jsonsafe import finite_or_none as _f
from depthlens.io.jsonsafe import jsonable

METRICS = registry.NAMES  # every diagnostic, in table/file order
SWEEP_METRICS = {d.name: d.headline.key for d in registry.DIAGNOSTICS if d.headline}  # -> sweep.METRICS key
DEAD_PREFIX_EPS = 0.05
DEFAULT_N_SEQ = 32
DEFAULT_SEQ_LEN = 128
DEFAULT_N_BOOT = 1000
UNTRAINED_METRICS = ("causal", "permutation", "rank", "attnres")  # those the table and the orderings read


def parse_metrics(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'causal,permutation' (or a list; registry aliases such as 'permute' too) → canonical-order tuple;
    ValueError (usage) on unknown names."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    bad = [n for n in names if n not in registry.ALIASES]
    names = [registry.get(n).name for n in names if n in registry.ALIASES]
    if bad or not names:
        err = ValueError(f"--metrics: unknown {', '.join(map(repr, bad))}; choose from {','.join(METRICS)}"
                         if bad else f"--metrics: give at least one of {','.join(METRICS)}")
        err.usage = True  # type: ignore[attr-defined]  (the CLI turns it into exit 2)
        raise err
    return tuple(m for m in METRICS if m in names)


@dataclass
class ReportOptions:
    """What the report computes. seq_len None = min(128, the smallest max_seq_len of the checkpoints)."""

    data: str | os.PathLike | None = None
    n_seq: int = DEFAULT_N_SEQ
    seq_len: int | None = None
    seed: int = 0
    device: str = "cpu"
    dtype: str = "fp32"  # weights and activations (--dtype fp32 | bf16 | fp64); reductions stay fp32/fp64
    metrics: tuple[str, ...] = METRICS
    n_boot: int = DEFAULT_N_BOOT
    causal_layers: str = "all"
    perm_pairs: str = "late"
    batch_size: int | None = None
    threads: int | None = 1  # torch CPU threads while computing; None/0 = leave torch's setting
    # diagnostics also run on the untrained model of each checkpoint's config and training seed (its step-0
    # weights, `untrained_model`): the baseline a learned effect is measured against. () = none.
    untrained: tuple[str, ...] = UNTRAINED_METRICS
    # the untrained permutation runs on the first `untrained_perm_n_seq` eval sequences only (None: all): at
    # init every swap moves a near-uniform prediction by a hair, and the permutation engine is most of a
    # report's cost; the trained − untrained difference pairs the same sequences
    untrained_perm_n_seq: int | None = 8

    def engine_options(self, metric: str) -> dict[str, Any]:
        """Options of diagnostic `metric`'s engine: its registry defaults plus this report's choices."""
        own = {"causal": {"layers": self.causal_layers}, "permutation": {"pairs": self.perm_pairs}}.get(metric, {})
        return {**registry.get(metric).report_opts, **own, "batch_size": self.batch_size}

    def as_dict(self) -> dict[str, Any]:
        return {"data": None if self.data is None else str(self.data), "n_seq": self.n_seq, "seq_len": self.seq_len,
                "seed": self.seed, "device": self.device, "dtype": self.dtype, "metrics": list(self.metrics),
                "n_boot": self.n_boot,
                "causal_layers": self.causal_layers, "causal_variant": "current", "perm_pairs": self.perm_pairs,
                "perm_swap": "body", "batch_size": self.batch_size, "threads": self.threads,
                "window_start": "quarter",
                "dead_prefix_eps": DEAD_PREFIX_EPS, "untrained": list(self.untrained),
                "untrained_perm_n_seq": self.untrained_perm_n_seq}


@dataclass
class Entry:
    """One checkpoint of the report and everything computed on it."""

    name: str
    path: Path
    model: Any
    slug: str
    n_layer: int
    d_model: int
    params: dict[str, Any]
    train: dict[str, Any]
    datasets: dict[str, Any] = field(default_factory=dict)  # metric -> xr.Dataset
    untrained: dict[str, Any] = field(default_factory=dict)  # metric -> xr.Dataset of the step-0 model
    seconds: dict[str, float] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)  # metric -> path relative to the report dir
    notes: list[str] = field(default_factory=list)

    @property
    def seed(self) -> int | None:
        """The training seed (train.json `seed`, else its recipe's); None when unknown."""
        for v in (self.train.get("seed"), (self.train.get("recipe") or {}).get("seed")):
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    @property
    def val_loss(self) -> float:
        v = self.train.get("final_val_loss")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


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


Progress = Callable[[str], None]  # called once per finished step with a short description


def _noop(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------------------------
# 1. output location


def is_report_dir(path: Path) -> bool:
    """An empty directory, or one holding a depthlens report's manifest.json: safe to replace with --overwrite."""
    try:
        if not any(path.iterdir()):
            return True
        meta = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("title") == "depthlens report"


def check_out(out: str | os.PathLike, overwrite: bool) -> Path:
    """Fail early (DepthlensError, one line) if `out` exists without overwrite, is a file or a directory that is
    not a report (never replaced, so `--out checkpoints --overwrite` cannot wipe anything), or can't be created."""
    out = Path(out)
    recover(out)  # an interrupted swap of an earlier run: keep the newest complete report
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise DepthlensError(f"{out} exists and is not a directory")
        if not overwrite:
            raise DepthlensError(f"{out} already exists; pass --overwrite to replace it")
        if not is_report_dir(out):
            raise DepthlensError(f"{out} exists and is not a depthlens report (no manifest.json from one); "
                                 "refusing to replace it, even with --overwrite")
    anc = out.parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise DepthlensError(f"cannot write {out}: {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise DepthlensError(f"cannot write {out}: directory {anc} is not writable")
    return out


# ---------------------------------------------------------------------------------------------------------------
# 2. checkpoints


def _names(paths: Sequence[Path]) -> list[str]:
    """Directory names, made unique (and file-name safe) with a numeric suffix where two collide."""
    raw = ["".join(c if c.isalnum() or c in "-_." else "_" for c in (p.resolve().name or "checkpoint"))
           for p in paths]
    out, seen = [], {}
    for n in raw:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 and raw.count(n) == 1 else f"{n}-{k + 1}")
    return out


def load_entries(paths: Sequence[str | os.PathLike], device: str = "cpu",
                 only: Sequence[int] | None = None, dtype: str = "fp32") -> list[Entry]:
    """Load and validate every checkpoint (CheckpointError on the first bad one), in the given order.
    only: the positions to load (one rank's share); names stay those of the whole set."""
    from depthlens.adapters.load import describe, open_model

    if not paths:
        raise DepthlensError("report needs at least one checkpoint")
    paths = [Path(p) for p in paths]
    keep = range(len(paths)) if only is None else set(only)
    entries = []
    for k, (name, p) in enumerate(zip(_names(paths), paths)):
        if k not in keep:
            continue
        op = open_model(p, device=device, dtype=registry.load_dtype(dtype))
        s = describe(op)
        train = getattr(op.meta.checkpoint, "train", None) or {}
        entries.append(Entry(name=name, path=p, model=op.model, slug=op.meta.arch, n_layer=int(op.meta.n_layer),
                             d_model=int(s["d_model"]), params=s, train=dict(train)))
    return entries


def sort_key(e: Entry) -> tuple:
    """Table order: design in registry order, then depth."""
    from depthlens.designs import SLUGS

    return (SLUGS.index(e.slug) if e.slug in SLUGS else len(SLUGS), e.slug, e.n_layer, e.name)


# ---------------------------------------------------------------------------------------------------------------
# 3. eval data


def tokenizer_facts(entries: Sequence[Entry], opts: ReportOptions) -> tuple[list[Any], list[tuple[str, int]]]:
    """Every checkpoint's tokenizer, and its (tokenizer name, max_seq_len): all the shared eval data depends on."""
    from depthlens.analysis.api import _is_shards, _tokenizer_for

    toks = [_tokenizer_for(e.path, e.model, required=not _is_shards(opts.data)) for e in entries]
    return toks, [(str(getattr(t, "name", t)), int(e.model.config.max_seq_len)) for t, e in zip(toks, entries)]


def report_eval_data(entries: Sequence[Entry], opts: ReportOptions, facts: Sequence[tuple[str, int]] | None = None):
    """One EvalData for all checkpoints: same tokenizer required; checked against every model.
    facts: (tokenizer name, max_seq_len) of the whole set when `entries` is one rank's share (report.ranks)."""
    from depthlens.analysis.evaldata import load_eval_data

    toks, own = tokenizer_facts(entries, opts)
    facts = own if facts is None else facts
    names = {name for name, _ in facts}
    if len(names) > 1:
        raise DepthlensError(f"the checkpoints use different tokenizers ({', '.join(sorted(names))}); "
                             "a report compares them on one eval set")
    max_len = min(m for _, m in facts)
    T = opts.seq_len or min(DEFAULT_SEQ_LEN, max_len)
    data = load_eval_data(opts.data, toks[0], n_seq=opts.n_seq, seq_len=T, seed=opts.seed, max_seq_len=max_len)
    for e in entries:
        try:
            data.check_model(e.model.config.vocab_size, e.model.config.max_seq_len)
        except DepthlensError as err:
            raise type(err)(f"{e.path}: {err}") from None
    return data


# ---------------------------------------------------------------------------------------------------------------
# 4. diagnostics


def tasks(entries: Sequence[Entry], opts: ReportOptions) -> list[tuple[Entry, str]]:
    """(checkpoint, diagnostic) pairs to run: the requested diagnostics that apply to each design."""
    return [(e, m) for e in entries for m in opts.metrics if registry.get(m).applies(e.slug)]


def compute(entries: Sequence[Entry], data, opts: ReportOptions, progress: Progress = _noop) -> None:
    """Fill `entry.datasets` for every applicable metric. A metric that is undefined for a model (a
    DepthlensError from the engine, e.g. too few layers for late pairs) is recorded as a note, not fatal."""
    import torch

    # Tiny models: one thread is much faster than two (13x for a permutation sweep at L = 16 with a busy
    # second core, and still faster on an idle machine), so the default is 1.
    prev = torch.get_num_threads()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        _compute(entries, data, opts, progress)
    finally:
        torch.set_num_threads(prev)


def _compute(entries: Sequence[Entry], data, opts: ReportOptions, progress: Progress) -> None:
    import torch

    with torch.no_grad():
        for e, m in tasks(entries, opts):
            t0 = time.perf_counter()
            try:
                e.datasets[m] = registry.run(m, e.model, data, checkpoint=e.path, **opts.engine_options(m))
            except (DepthlensError, ValueError) as err:
                e.notes.append(f"{m}: not computed ({str(err).splitlines()[0]})")
            e.seconds[m] = round(time.perf_counter() - t0, 3)
            progress(f"{e.name}: {m}")
        for e in entries:
            _compute_untrained(e, data, opts)


def untrained_model(e: Entry):
    """The model of `e`'s config as the trainer initialises it for `e`'s training seed (`build_model(config,
    seed)`, exactly the trainer's step-0 weights), on `e`'s device and dtype; None when the seed or a
    depthlens config is unknown."""
    from depthlens.models.config import ModelConfig
    from depthlens.models.model import build_model

    cfg = getattr(e.model, "config", None)
    if e.seed is None or not isinstance(cfg, ModelConfig):
        return None
    p = next(e.model.parameters())
    return build_model(cfg, seed=e.seed).to(device=p.device, dtype=p.dtype).eval()


def untrained_data(data, metric: str, opts: ReportOptions):
    """The eval data an untrained diagnostic runs on: all of it, or a prefix for the permutation."""
    import dataclasses

    k = opts.untrained_perm_n_seq
    if metric != "permutation" or not k or k >= data.n_seq:
        return data
    return dataclasses.replace(data, tokens=data.tokens[:k])


def _compute_untrained(e: Entry, data, opts: ReportOptions) -> None:
    import torch

    todo = [m for m in opts.metrics if m in opts.untrained and registry.get(m).applies(e.slug)]
    if not todo:
        return
    model = untrained_model(e)
    if model is None:
        e.notes.append("untrained baseline: not computed (no training seed in train.json)")
        return
    t0 = time.perf_counter()
    with torch.no_grad():
        for m in todo:
            try:
                e.untrained[m] = registry.run(m, model, untrained_data(data, m, opts), checkpoint=e.path,
                                              **opts.engine_options(m))
            except (DepthlensError, ValueError) as err:
                e.notes.append(f"{m} (untrained): not computed ({str(err).splitlines()[0]})")
    e.seconds["untrained"] = round(time.perf_counter() - t0, 3)


# ---------------------------------------------------------------------------------------------------------------
# 5. summary, sweeps, robustness


SHARE_FIELDS = ("share", "ci_low", "ci_high", "ci_method", "ci_unit", "share_full", "subsample_m", "eval_sizes",
                "eval_size_tokens", "eval_size_shares", "still_rising", "shard_mean", "shard_sd", "n_pairs",
                "definition", "share_untrained", "untrained_n_seq", "untrained_diff", "untrained_diff_low", "untrained_diff_high")
RECORD_KEYS = (
    "checkpoint", "design", "design_name", "n_layer", "d_model", "params_total", "params_non_embedding", "seed", "lr",
    "val_loss", "eval_loss", "eval_loss_untrained",
    *(f"causal_{k}" for k in SHARE_FIELDS), "causal_noise_floor", "causal_theta_50", "causal_theta_10",
    *(f"perm_{k}" for k in SHARE_FIELDS), "perm_theta_50", "perm_theta_10",
    "erank_full", "erank_late", "erank_full_untrained", "n_streams", "dead_prefix", "dead_prefix_untrained",
    "angular_d1_mean", "path", "seconds",
)


def _headline(ds, metric: str, opts: ReportOptions) -> dict[str, Any] | None:
    from depthlens.analysis.sweep import headline

    try:
        return headline(ds, metric, n_boot=opts.n_boot, seed=opts.seed, start="quarter")
    except (DepthlensError, ValueError):
        return None


def _headline_fields(prefix: str, h: dict[str, Any]) -> dict[str, Any]:
    """The headline share with its interval (method and unit named), the share at all N sequences, the
    eval-size curve and its still-rising flag, under `<prefix>_*` record keys."""
    out = {f"{prefix}_{k}": _f(h.get(k)) for k in ("share", "ci_low", "ci_high", "share_full", "shard_mean",
                                                   "shard_sd")}
    for k in ("ci_method", "ci_unit", "subsample_m", "eval_sizes", "eval_size_tokens", "eval_size_shares",
              "still_rising", "n_pairs", "definition"):
        out[f"{prefix}_{k}"] = h.get(k)
    return out


def paired_share_difference(a, b, metric: str, opts: ReportOptions):
    """share(a) − share(b) with its paired interval over the eval sequences (`sweep.paired_share_difference`
    with the report's θ, window and resampling seed); None when either has none."""
    from depthlens.analysis.sweep import paired_share_difference as paired

    return paired(a, b, metric, start="quarter", n_boot=opts.n_boot, seed=opts.seed)


def _untrained_fields(prefix: str, key: str, ds, base, opts: ReportOptions) -> dict[str, Any]:
    """share on the untrained model, and trained − untrained with its interval paired over sequences."""
    h = _headline(base, key, opts)
    out = {f"{prefix}_share_untrained": _f(h.get("share")) if h else None,
           f"{prefix}_untrained_n_seq": int(base.sizes.get("sequence", 0)) or None}
    d = paired_share_difference(ds, base, key, opts)
    if d is not None:
        out.update({f"{prefix}_untrained_diff": _f(d.estimate), f"{prefix}_untrained_diff_low": _f(d.low),
                    f"{prefix}_untrained_diff_high": _f(d.high)})
    return out


def _eval_loss(ds) -> float | None:
    if ds is not None and "clean_loss_seq" in ds and np.isfinite(ds["clean_loss_seq"].values).any():
        return _f(np.nanmean(ds["clean_loss_seq"].values))
    return None


def _dead_prefix(ds) -> int | None:
    if ds is None or "dead_prefix" not in ds:
        return None
    eps = np.asarray(ds["eps"].values, dtype=float)
    k = int(np.argmin(np.abs(eps - DEAD_PREFIX_EPS)))
    return int(ds["dead_prefix"].values[k]) if abs(eps[k] - DEAD_PREFIX_EPS) < 1e-9 else None


def _erank(ds, product: str = "full") -> float | None:
    return None if ds is None else _f(ds["erank"].sel(product=product, statistic="mean").values)


def record(e: Entry, opts: ReportOptions, sweeps: dict[str, Any]) -> dict[str, Any]:
    """One table row (JSON-safe; NaN → None)."""
    from depthlens.analysis.sweep import interval_attrs
    from depthlens.designs import DESIGNS

    r: dict[str, Any] = {k: None for k in RECORD_KEYS}
    r.update(checkpoint=e.name, design=e.slug, design_name=DESIGNS[e.slug].name if e.slug in DESIGNS else e.slug,
             n_layer=e.n_layer, d_model=e.d_model, params_total=e.params.get("params_total"),
             params_non_embedding=e.params.get("params_non_embedding"), val_loss=_f(e.val_loss), path=str(e.path),
             seed=e.seed, lr=_f((e.train.get("recipe") or {}).get("lr")), seconds=round(sum(e.seconds.values()), 2))
    for d in registry.DIAGNOSTICS:  # the headline share of every diagnostic that has one, and its crossings
        ds, sw = e.datasets.get(d.name), sweeps.get(d.name)
        h = _headline(ds, d.headline.key, opts) if ds is not None and d.headline else None
        if h:
            r.update(_headline_fields(d.prefix, h))
            ds.attrs.update(interval_attrs(h))  # the merged netCDF names the interval its record carries
            if f"{d.prefix}_noise_floor" in r:
                r[f"{d.prefix}_noise_floor"] = _f(h.get("noise_floor"))
            base = e.untrained.get(d.name)
            if base is not None:
                r.update(_untrained_fields(d.prefix, d.headline.key, ds, base, opts))
        if sw is not None and e.name in sw["checkpoint"].values:
            cr = sw["crossing"].sel(checkpoint=e.name)
            r[f"{d.prefix}_theta_50"] = _f(cr.sel(q=0.5).values)
            r[f"{d.prefix}_theta_10"] = _f(cr.sel(q=0.1).values)
    r["eval_loss"] = _eval_loss(e.datasets.get("causal"))
    r["eval_loss_untrained"] = _eval_loss(e.untrained.get("causal"))
    ds = e.datasets.get("permutation")
    if ds is not None and r["eval_loss"] is None and "clean_loss" in ds:
        r["eval_loss"] = _f(ds["clean_loss"].values)
    ds = e.datasets.get("rank")
    if ds is not None:
        r["erank_full"], r["erank_late"] = _erank(ds), _erank(ds, "late")
        if "n_streams" in ds.coords:
            r["n_streams"] = int(ds["n_streams"].values)
    r["erank_full_untrained"] = _erank(e.untrained.get("rank"))
    r["dead_prefix"] = _dead_prefix(e.datasets.get("attnres"))
    r["dead_prefix_untrained"] = _dead_prefix(e.untrained.get("attnres"))
    ds = e.datasets.get("angular")
    if ds is not None and "profile" in ds:
        prof = np.asarray(ds["profile"].values, dtype=float)[: e.n_layer]
        r["angular_d1_mean"] = _f(np.nanmean(prof)) if np.isfinite(prof).any() else None
    return jsonable(r)


def _loss_changes(by: dict, design: str, L: int, opts: ReportOptions) -> list[dict[str, Any]]:
    """Per seed present at L and L/2: eval loss at L minus at L/2, paired over the same eval sequences."""
    from depthlens.analysis.intervals import bootstrap_counts, mean_interval

    out = []
    for (d, depth, s), deep in by.items():
        shallow = by.get((design, L // 2, s))
        if d != design or depth != L or shallow is None:
            continue
        row: dict[str, Any] = {"score": "loss_change", "higher": design, "lower": None, "L": L, "seed": s}
        for tag, a, b in (("", deep.datasets, shallow.datasets), ("untrained_", deep.untrained, shallow.untrained)):
            if "causal" not in a or "causal" not in b:
                continue
            diff = a["causal"]["clean_loss_seq"].values - b["causal"]["clean_loss_seq"].values
            if not np.isfinite(diff).all() or diff.size < 2:
                continue
            it, _ = mean_interval(diff, counts=bootstrap_counts(diff.size, max(opts.n_boot, 2), opts.seed))
            row.update({f"{tag}diff": it.estimate, f"{tag}low": it.low, f"{tag}high": it.high,
                        f"{tag}method": f"paired {it.method}", f"{tag}unit": it.unit})
        out.append(jsonable(row))
    return out


def comparisons(entries: Sequence[Entry], opts: ReportOptions, claims: Sequence[Any] | None = None
                ) -> list[dict[str, Any]]:
    """For every ordering claim on a share (report.orderings.CLAIMS): per training seed present in both designs,
    the paired difference higher − lower over the same eval sequences, trained and untrained. The orderings
    pool them over seeds (one seed: this interval, which excludes training variance)."""
    from depthlens.report.orderings import CLAIMS

    by = {(e.slug, e.n_layer, e.seed): e for e in entries}
    out = []
    for c in CLAIMS if claims is None else claims:
        if c.kind == "sign" and c.score == "loss_change":
            out += _loss_changes(by, c.higher, c.L, opts)
        if c.score not in ("causal", "perm"):
            continue
        metric, key = ("causal", "causal") if c.score == "causal" else ("permutation", "perm_abs")
        seeds = sorted({s for (d, L, s) in by if d == c.higher and L == c.L} &
                       {s for (d, L, s) in by if d == c.lower and L == c.L}, key=lambda s: (s is None, s))
        for s in seeds:
            hi, lo = by[(c.higher, c.L, s)], by[(c.lower, c.L, s)]
            row: dict[str, Any] = {"score": c.score, "higher": c.higher, "lower": c.lower, "L": c.L, "seed": s}
            for tag, ga, gb in (("", hi.datasets, lo.datasets), ("untrained_", hi.untrained, lo.untrained)):
                a, b = ga.get(metric), gb.get(metric)
                d = paired_share_difference(a, b, key, opts) if a is not None and b is not None else None
                if d is not None:
                    row.update({f"{tag}diff": d.estimate, f"{tag}low": d.low, f"{tag}high": d.high,
                                f"{tag}method": d.method, f"{tag}unit": d.unit})
            out.append(jsonable(row))
    return out


def sweeps_for(entries: Sequence[Entry], metric: str):
    """S(θ) on the default θ grid and crossing points, window start ⌊L/4⌋, stacked along `checkpoint`
    (with per-checkpoint `design` and `n_layer` coordinates). None when no checkpoint has the metric."""
    import xarray as xr

    from depthlens.analysis.sweep import (
        HEADLINE_THRESHOLD,
        default_thresholds,
        share_curves,
    )

    key = SWEEP_METRICS[metric]
    have = [e for e in entries if metric in e.datasets]
    # the default grid plus the headline θ itself (the log grid of P_abs does not contain 0.15), so the
    # ranking and the curves use exactly the headline share of the table
    grid = np.unique(np.concatenate([default_thresholds(key), [HEADLINE_THRESHOLD[key]]]))
    parts, names = [], []
    for e in have:
        try:
            sc = share_curves(e.datasets[metric], key, grid, starts=("quarter",), aggregator="max" if key == "causal"
                              else None, variant="current" if key == "causal" else None)
        except (DepthlensError, ValueError) as err:
            e.notes.append(f"{metric} sweep: not computed ({str(err).splitlines()[0]})")
            continue
        parts.append(sc.squeeze("window_start", drop=True))
        names.append(e.name)
    if not parts:
        return None
    out = xr.concat([p.assign_coords(checkpoint=n) for p, n in zip(parts, names)], dim="checkpoint",
                    combine_attrs="drop_conflicts")
    by = {e.name: e for e in have}
    out = out.assign_coords(design=("checkpoint", [by[n].slug for n in names]),
                            n_layer=("checkpoint", [by[n].n_layer for n in names]))
    out.attrs.update(metric=key, headline_threshold=HEADLINE_THRESHOLD[key], window_start="quarter",
                     Conventions="CF-1.11", title=f"depthlens share curves of {key} (late window)")
    return out


def robustness_for(sw, metric: str) -> list[dict[str, Any]]:
    """Per depth (≥ 2 designs): the reference ranking = designs ordered by their headline share, ties broken
    by the mean of the curve (its integral over the grid, i.e. the mean score); the fraction of the θ grid
    on which that strict ordering holds (`sweep.robustness`), and Kendall τ-b between the shares at each θ
    and the reference ranks (mean and min over the grid; θ where every share ties are skipped)."""
    from depthlens.analysis.metrics import kendall_tau
    from depthlens.analysis.sweep import robustness

    out = []
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
            tau = np.array([kendall_tau(S[:, k], ranks) if np.ptp(S[:, k]) > 0 else np.nan
                            for k in range(S.shape[1])])
        fin = tau[np.isfinite(tau)]
        out.append(jsonable({
            "metric": metric, "n_layer": L, "headline_threshold": h,
            "order": [design[n] for n in order], "order_checkpoints": order,
            "shares_at_headline": [float(vals[n][hk]) for n in order],
            "fraction_holds": float(rb["fraction"].values),
            "kendall_tau_mean": float(fin.mean()) if fin.size else None,
            "kendall_tau_min": float(fin.min()) if fin.size else None,
        }))
    return out


def summarise(entries: Sequence[Entry], data, opts: ReportOptions, progress: Progress = _noop) -> Report:
    rep = Report(entries=sorted(entries, key=sort_key), options=opts, data=data)
    for metric in SWEEP_METRICS:
        if metric in opts.metrics:
            sw = sweeps_for(rep.entries, metric)
            if sw is not None:
                rep.sweeps[metric] = sw
                rep.robustness += robustness_for(sw, metric)
    for e in rep.entries:
        rep.records.append(record(e, opts, rep.sweeps))
    rep.comparisons = comparisons(rep.entries, opts)
    progress("summary")
    return rep


# ---------------------------------------------------------------------------------------------------------------
# 6. writing


def _group_key(ds) -> tuple:
    idx = tuple((k, tuple(str(v) for v in ds.indexes[k])) for k in sorted(ds.indexes))
    return (tuple(sorted(ds.sizes.items())), idx)


def merged_datasets(entries: Sequence[Entry], metric: str) -> list[tuple[str, list[str], Any]]:
    """[(file name, checkpoint names, Dataset)]: concatenated along `checkpoint` within equal-shape groups."""
    from depthlens.analysis.dataset import concat_checkpoints

    have = [e for e in entries if metric in e.datasets]
    groups: dict[tuple, list[Entry]] = {}
    for e in have:
        groups.setdefault(_group_key(e.datasets[metric]), []).append(e)
    if not groups:
        return []
    # file names: <metric>.nc for a single group; else <metric>_l<L>.nc for the (strictly) largest group of a depth and
    # <metric>_l<L>_<design>[+<design>...].nc for the others (e.g. MoDA's depth_mass, Full vs Block AttnRes)
    out, used = [], set()
    sizes: dict[int, list[int]] = {}
    for members in groups.values():
        sizes.setdefault(members[0].n_layer, []).append(len(members))
    for members in groups.values():
        if len(groups) == 1:
            fname = metric
        else:
            L = members[0].n_layer
            fname = f"{metric}_l{L}"
            others = list(sizes[L])
            others.remove(len(members))
            if others and len(members) <= max(others):  # not strictly the largest group of its depth
                fname += "_" + "+".join(dict.fromkeys(e.slug for e in members))
        base, k = fname, 2
        while fname in used:
            fname, k = f"{base}_{k}", k + 1
        used.add(fname)
        fname += ".nc"
        names = [e.name for e in members]
        ds = concat_checkpoints([e.datasets[metric] for e in members], names)
        ds = ds.assign_coords(design=("checkpoint", [e.slug for e in members]))
        for v in ds.data_vars.values():  # per-sequence arrays and NaN padding compress well (~5x smaller)
            if v.dtype.kind == "f" and v.ndim:
                v.encoding.update(zlib=True, complevel=4)
        out.append((fname, names, ds))
    return out




def manifest(rep: Report) -> dict[str, Any]:
    from depthlens.analysis.dataset import depthlens_version

    d = rep.data
    return jsonable({
        "title": "depthlens report", "depthlens_version": depthlens_version(), "command": rep.command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "world_size": rep.world_size,
        "options": rep.options.as_dict(),
        "eval_data": {"name": d.name, "source": d.source, "sha256": d.sha256, "n_seq": d.n_seq,
                      "seq_len": d.seq_len, "n_tokens": d.n_tokens, "seed": d.seed, "tokenizer": d.tokenizer},
        "checkpoints": [{"checkpoint": e.name, "path": str(e.path), "design": e.slug, "n_layer": e.n_layer,
                         "seconds": e.seconds, "figures": e.figures, "notes": e.notes} for e in rep.entries],
        "datasets": rep.files, "figures": rep.figures, "robustness": rep.robustness, "seconds": rep.seconds,
        "comparisons": rep.comparisons,
        "notes": rep.notes,
        "merge_rule": "per metric, checkpoints with identical dims and index coordinates are concatenated along "
                      "`checkpoint` (one file per group; <metric>.nc when there is one group, else "
                      "<metric>_l<L>[_<design>].nc)",
    })


def write_report(rep: Report, out: str | os.PathLike, overwrite: bool = False, progress: Progress = _noop) -> Path:
    """Write figures, datasets, summary.json, manifest.json, index.html and README.md into `out`, atomically."""
    from depthlens.analysis.dataset import write_netcdf

    from . import figures, render

    out = check_out(out, overwrite)
    try:
        # built under a temp name, swapped in whole; on failure or SIGTERM nothing is left (depthlens.io.atomic)
        with atomic_dir(out, overwrite=overwrite, checked=True) as tmp:
            (tmp / "figures").mkdir()
            t0 = time.perf_counter()
            for e in rep.entries:
                e.figures = figures.checkpoint_figures(e, tmp / "figures")
                progress(f"{e.name}: figures")
            rep.figures = figures.cross_figures(rep, tmp / "figures")
            progress("cross-checkpoint figures")
            rep.seconds["figures"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            for metric in METRICS:
                for fname, names, ds in merged_datasets(rep.entries, metric):
                    write_netcdf(ds, tmp / fname)
                    rep.files[fname] = names
            for metric, sw in rep.sweeps.items():
                fname = f"sweep_{SWEEP_METRICS[metric]}.nc"
                write_netcdf(sw, tmp / fname)
                rep.files[fname] = [str(n) for n in sw["checkpoint"].values]
            rep.seconds["datasets"] = round(time.perf_counter() - t0, 2)
            atomic_write_text(tmp / "summary.json", json.dumps(rep.records, indent=1) + "\n")
            atomic_write_text(tmp / "manifest.json", json.dumps(manifest(rep), indent=1) + "\n")
            atomic_write_text(tmp / "index.html", render.render_html(rep))
            atomic_write_text(tmp / "README.md", render.render_markdown(rep))
        progress("write")
    except OSError as e:
        raise DepthlensError(f"cannot write {out}: {e.strerror or e}") from e
    return out


# ---------------------------------------------------------------------------------------------------------------
# everything


def compute_spread(paths: Sequence[str | os.PathLike], out: str | os.PathLike, opts: ReportOptions, *,
                   overwrite: bool = False, progress: Progress = _noop,
                   on_loaded: Callable[[int], None] | None = None) -> tuple[list[Entry], Any, float, int] | None:
    """Steps 1-4 under torchrun, each rank on whole checkpoints of its own (report.ranks). Rank 0 returns
    (every Entry in the given order, eval data, compute seconds, world size), the other ranks None. After each
    step every rank `agree`s ok/error, so one failing rank stops them all with its line."""
    from depthlens.analysis.distributed import (agree, device_for_rank, gather_to_main, local_only,
                                                long_wait_group, world)

    from .ranks import assign, attempt, pack, unpack

    group = long_wait_group()
    rank, n = world()
    paths = [Path(p) for p in paths]

    def plan() -> list[int]:
        check_out(out, overwrite)
        return assign(paths, n)

    def load() -> tuple[list[Entry], list[tuple[str, int]]]:
        own = load_entries(paths, device=device_for_rank(opts.device), only=mine, dtype=opts.dtype)
        return own, tokenizer_facts(own, opts)[1]

    # 1. rank 0 checks --out and assigns the checkpoints (its assignment is the one every rank uses)
    err, owner = attempt(plan) if rank == 0 else (None, None)
    mine = [i for i, r in enumerate(agree(err, owner, group)[0]) if r == rank]
    # 2. load my checkpoints; every rank builds the eval data one process builds, from the whole set's facts
    err, loaded = attempt(load)
    entries, facts = loaded or ([], [])
    facts = [f for part in agree(err, facts, group) for f in part]
    err, data = attempt(lambda: report_eval_data(entries, opts, facts=facts) if entries else None)
    hashes = {h for h in agree(err, None if data is None else data.sha256, group) if h is not None}
    if len(hashes) > 1:  # identical inputs must give identical tokens: never compare checkpoints on different data
        raise DepthlensError(f"the ranks built different eval data ({len(hashes)} token hashes)")
    if on_loaded is not None:
        on_loaded(n_steps(entries, opts, n_checkpoints=len(paths)))
    # 3. every diagnostic on my checkpoints; the engines must not split their arms over the ranks again
    t0 = time.perf_counter()
    with local_only():
        err, _ = attempt(lambda: compute(entries, data, opts, progress))
    agree(err, None, group)
    # 4. records and datasets to rank 0
    parts = gather_to_main([(i, pack(e)) for i, e in zip(mine, entries)], group)
    if parts is None:
        return None
    done = dict(p for part in parts for p in part)
    return [Entry(**unpack(done[i])) for i in range(len(paths))], data, time.perf_counter() - t0, n


def n_steps(entries: Sequence[Entry], opts: ReportOptions, n_checkpoints: int | None = None) -> int:
    """Progress steps of `build_report` after loading: metric runs of `entries` (rank 0's share under
    torchrun), figures per checkpoint (all n_checkpoints), summary, cross-checkpoint figures, write."""
    return len(tasks(entries, opts)) + (len(entries) if n_checkpoints is None else n_checkpoints) + 3


def build_report(paths: Sequence[str | os.PathLike], out: str | os.PathLike, opts: ReportOptions | None = None, *,
                 overwrite: bool = False, progress: Progress = _noop,
                 on_loaded: Callable[[int], None] | None = None) -> Report | None:
    """Load, compute, summarise and write a report. `on_loaded(n_steps)` runs once the checkpoints are
    validated (the CLI sizes its progress bar there).

    Under torchrun (WORLD_SIZE > 1) every rank computes whole checkpoints of its own (report.ranks) and rank 0
    writes the report a single process writes; the other ranks return None."""
    from depthlens.analysis.distributed import launched

    opts = opts or ReportOptions()
    t_start = time.perf_counter()
    world_size = 1
    if launched():
        spread = compute_spread(paths, out, opts, overwrite=overwrite, progress=progress, on_loaded=on_loaded)
        if spread is None:
            return None
        entries, data, t_compute, world_size = spread
    else:
        check_out(out, overwrite)
        entries = load_entries(paths, device=opts.device, dtype=opts.dtype)
        data = report_eval_data(entries, opts)
        if on_loaded is not None:
            on_loaded(n_steps(entries, opts))
        t0 = time.perf_counter()
        compute(entries, data, opts, progress)
        t_compute = time.perf_counter() - t0
    rep = summarise(entries, data, opts, progress)
    rep.world_size = world_size
    rep.command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    rep.seconds["compute"] = round(t_compute, 2)
    write_report(rep, out, overwrite, progress)
    rep.seconds["total"] = round(time.perf_counter() - t_start, 2)
    # the total is known only after writing; record it in the manifest too (small atomic rewrite)
    atomic_write_text(Path(out) / "manifest.json", json.dumps(manifest(rep), indent=1) + "\n")
    return rep

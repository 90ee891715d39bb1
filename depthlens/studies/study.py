"""A study: models (checkpoints, snapshots, foreign models) × the applicable diagnostics × one eval set.

    study = run_study(paths, StudyOptions(metrics=("causal", "permutation")))   # Entry per model, datasets filled
    study.entries[0].datasets["causal"]                                            # the engine's Dataset

This is the loop report, compare, sweep and the API share: `load_entries` (the one loader: depthlens and Hugging
Face directories, GGUF files, `device_map` for HF/GGUF models over several GPUs), `study_eval_data` (one EvalData
for every model: same tokenizer required, seq_len capped at the smallest max_seq_len), `compute` (every
requested diagnostic that applies to each design, through `registry.run`; one that is undefined for a model is
a note, not fatal; each result comes from the result cache, `studies.cache`, when it holds it). Under torchrun
(`run_study` when WORLD_SIZE > 1: `compute_spread`) every rank loads and computes whole models of its own
(`runtime.ranks` assigns them by estimated cost) and rank 0 gathers them; after each step every rank `agree`s
ok/error, so a failing rank stops the run on every rank with its one line. `each_computed` is the same study with
one model in memory at a time, on given eval data (track's snapshots).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError, UsageError
from depthlens.runtime.defaults import DEFAULT_N_BOOT, DEFAULT_N_SEQ
from depthlens.runtime.evaldata import EvalData

if TYPE_CHECKING:
    from .cache import ResultCache

Progress = Callable[[str], None]  # called once per finished step with a short description


def _noop(_: str) -> None:
    pass


def choose_metrics(
    spec: str | Sequence[str], every: Sequence[str], canonical: Callable[[str], str | None]
) -> tuple[str, ...]:
    """`--metrics`: 'a,b' (or a list) → the chosen names of `every`, in `every`'s order. `canonical` maps a given
    name (an alias too) to its name in `every`, None when it has none; UsageError names the unknown ones."""
    given = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    names = [canonical(n) for n in given]
    bad = [g for g, n in zip(given, names, strict=True) if n is None or n not in every]
    if bad or not given:
        raise UsageError(
            f"--metrics: unknown {', '.join(map(repr, bad))}; choose from {','.join(every)}"
            if bad
            else f"--metrics: give at least one of {','.join(every)}"
        )
    return tuple(m for m in every if m in names)


def parse_metrics(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'causal,permutation' (or a list; registry aliases such as 'permute' too) → canonical-order tuple;
    UsageError on unknown names."""
    known = registry.aliases()
    return choose_metrics(spec, registry.names(), lambda n: registry.get(n).name if n in known else None)


UNTRAINED_PERM_FOR = ("all", "claims")


@dataclass
class StudyOptions:
    """What a study computes, and on what: one options object for report, track, compare, sweep and the API.
    seq_len None = min(DEFAULT_SEQ_LEN, the smallest max_seq_len of the models)."""

    data: str | os.PathLike[str] | None = None
    n_seq: int = DEFAULT_N_SEQ
    seq_len: int | None = None
    seed: int = 0
    device: str = "cpu"
    dtype: str = "fp32"  # weights and activations (--dtype fp32 | bf16 | fp64); reductions stay fp32/fp64
    metrics: tuple[str, ...] = field(default_factory=registry.names)
    n_boot: int = DEFAULT_N_BOOT
    causal_layers: str = "all"
    perm_pairs: str = "late"
    batch_size: int | None = None
    threads: int | None = 1  # torch CPU threads while computing; None/0 = leave torch's setting
    device_map: str | None = None  # HF/GGUF models over several GPUs: "auto" or a JSON map (replaces device)
    late: bool = False  # run each engine restricted to what its late-window headline needs (compare, sweep)
    tokens: int | None = None  # an eval token budget instead of n_seq: n_seq = tokens // seq_len
    # diagnostics also run on the untrained model of each checkpoint's config and training seed (its step-0
    # weights, `untrained_model`): the baseline a learned effect is measured against. () = none.
    untrained: tuple[str, ...] = field(default_factory=registry.untrained_names)
    # the untrained permutation runs on the first `untrained_perm_n_seq` eval sequences only (None: all): at
    # init every swap moves a near-uniform prediction by a hair, and the permutation engine is most of a
    # report's cost; the trained − untrained difference pairs the same sequences
    untrained_perm_n_seq: int | None = 8
    # where the untrained permutation runs: "all" models, or "claims": only the (design, depth) cells a
    # permutation claim of the orderings check names (`stats.orderings.claim_cells`), the cells whose "holds at
    # init" needs it; the main job's choice, as the untrained permutation costs as much as the trained one
    untrained_perm_for: str = "all"
    # untrained twins only for checkpoints whose training seed is < `untrained_seeds` (a checkpoint without a
    # recorded seed counts as seed 0 and keeps its twin); None: every seed. The at-init reference of a cell needs
    # modest precision and a cell's seeds differ only in their init, so the main job builds 3 twins per cell
    # rather than one per training seed; every at-init number then pools exactly the seeds that have a twin
    untrained_seeds: int | None = None
    # the trained permutation on the first `perm_n_seq` eval sequences (None: all): a report's main cost at
    # L = 32 (every late pair re-runs the layers after it); the other diagnostics keep all `n_seq`
    perm_n_seq: int | None = None
    # --precision: causal and permutation grow their eval set in doublings (new sequences only) until the headline
    # interval's half-width is at most this, up to n_seq (studies/precision.py); None: the fixed n_seq
    precision: float | None = None
    # the result cache (`studies.cache`): None = on unless DEPTHLENS_NO_CACHE is set (`depthlens --no-cache`) or
    # DEPTHLENS_RESULTS_CACHE is "off"; how results are found, not what they are, so not in `as_dict` (results
    # are the same with and without it, and summary.json with them)
    cache: bool | None = None

    def __post_init__(self) -> None:
        if self.untrained_perm_for not in UNTRAINED_PERM_FOR:
            raise UsageError(
                f"untrained_perm_for must be one of {', '.join(UNTRAINED_PERM_FOR)}, got {self.untrained_perm_for!r}"
            )
        k = self.untrained_seeds
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise UsageError(f"untrained_seeds must be a whole number ≥ 1 (or None: every seed), got {k!r}")

    def has_twin(self, seed: int | None) -> bool:
        """Whether a checkpoint of training seed `seed` gets its untrained twin (`untrained_seeds`; an unknown
        seed counts as seed 0)."""
        return self.untrained_seeds is None or (seed or 0) < self.untrained_seeds

    def engine_options(self, metric: str) -> dict[str, Any]:
        """Options of diagnostic `metric`'s engine: its registry defaults plus this study's choices."""
        d = registry.get(metric)
        if self.late:
            return {**d.report_opts, **d.late_opts, "batch_size": self.batch_size}
        own = {opt: getattr(self, field_name) for opt, field_name in d.study_opts.items()}
        return {**d.report_opts, **own, "batch_size": self.batch_size}

    def as_dict(self) -> dict[str, Any]:
        return {
            "data": None if self.data is None else str(self.data),
            "n_seq": self.n_seq,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "device": self.device,
            "dtype": self.dtype,
            "metrics": list(self.metrics),
            "n_boot": self.n_boot,
            "causal_layers": self.causal_layers,
            "causal_variant": "current",
            "perm_pairs": self.perm_pairs,
            "perm_swap": "body",
            "batch_size": self.batch_size,
            "threads": self.threads,
            "window_start": "quarter",
            "dead_prefix_eps": registry.DEAD_PREFIX_EPS,
            "untrained": list(self.untrained),
            "untrained_perm_n_seq": self.untrained_perm_n_seq,
            "untrained_perm_for": self.untrained_perm_for,
            "perm_n_seq": self.perm_n_seq,
            "precision": self.precision,
            **({} if self.device_map is None else {"device_map": self.device_map}),
            **({} if self.tokens is None else {"tokens": self.tokens}),
            # only when set, so that a study at the default (twins for every seed) records what it did before
            **({} if self.untrained_seeds is None else {"untrained_seeds": self.untrained_seeds}),
        }


@dataclass
class Entry:
    """One model of a study (a checkpoint, snapshot or foreign model) and everything computed on it."""

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
    untrained_init: str | None = None  # how the untrained model was initialised (None: no untrained model)
    from_cache: list[str] = field(default_factory=list)  # results read from the result cache ("m", "m (untrained)")

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


# ---------------------------------------------------------------------------------------------------------------
# 1. models


def _names(paths: Sequence[Path]) -> list[str]:
    """Directory names, made unique (and file-name safe) with a numeric suffix where two collide."""
    raw = ["".join(c if c.isalnum() or c in "-_." else "_" for c in (p.resolve().name or "checkpoint")) for p in paths]
    out: list[str] = []
    seen: dict[str, int] = {}
    for n in raw:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 and raw.count(n) == 1 else f"{n}-{k + 1}")
    return out


def load_entries(
    paths: Sequence[str | os.PathLike[str]],
    device: str = "cpu",
    only: Sequence[int] | None = None,
    dtype: str = "fp32",
    device_map: str | None = None,
) -> list[Entry]:
    """Load and validate every model (CheckpointError on the first bad one), in the given order: the one loader
    of every study (depthlens and Hugging Face directories, GGUF files; `device_map` places HF/GGUF models over
    several GPUs). only: the positions to load (one rank's share); names stay those of the whole set."""
    from depthlens.adapters.load import describe, open_model
    from depthlens.adapters.placement import parse_device_map

    if not paths:
        raise DepthlensError("a study needs at least one checkpoint")
    files = [Path(p) for p in paths]
    keep = range(len(files)) if only is None else set(only)
    entries = []
    for k, (name, p) in enumerate(zip(_names(files), files)):
        if k not in keep:
            continue
        op = open_model(p, device=device, dtype=registry.load_dtype(dtype), device_map=parse_device_map(device_map))
        s = describe(op)
        train = getattr(op.meta.checkpoint, "train", None) or {}
        entries.append(
            Entry(
                name=name,
                path=p,
                model=op.model,
                slug=op.meta.arch,
                n_layer=int(op.meta.n_layer),
                d_model=int(s["d_model"]),
                params=s,
                train=dict(train),
            )
        )
    return entries


def sort_key(e: Entry) -> tuple[int, str, int, str]:
    """Table order: design in registry order, then depth."""
    from depthlens.designs import SLUGS

    return (SLUGS.index(e.slug) if e.slug in SLUGS else len(SLUGS), e.slug, e.n_layer, e.name)


# ---------------------------------------------------------------------------------------------------------------
# 2. eval data


class Loaded(NamedTuple):
    """What the eval-set rule reads of one model of a study: where it was loaded from, and the model (an `Entry`
    has both; `track` passes the first snapshot of each series)."""

    path: Path
    model: Any


def tokenizer_facts(entries: Sequence[Entry | Loaded], opts: StudyOptions) -> tuple[list[Any], list[tuple[str, int]]]:
    """Every checkpoint's tokenizer, and its (tokenizer name, max_seq_len): all the shared eval data depends on."""
    from depthlens.runtime.evaldata import is_shards, tokenizer_for

    toks = [tokenizer_for(e.path, e.model, required=not is_shards(opts.data)) for e in entries]
    return toks, [(str(getattr(t, "name", t)), int(e.model.config.max_seq_len)) for t, e in zip(toks, entries)]


def study_eval_data(
    entries: Sequence[Entry | Loaded], opts: StudyOptions, facts: Sequence[tuple[str, int]] | None = None
) -> EvalData:
    """The one eval-set rule of every study (report, compare, sweep, track, the API): one EvalData for all models,
    the same tokenizer required, seq_len capped at the smallest max_seq_len; checked against every model.
    facts: (tokenizer name, max_seq_len) of the whole set when `entries` is one rank's share (runtime.ranks)."""
    from depthlens.runtime.evaldata import eval_set

    toks, own = tokenizer_facts(entries, opts)
    facts = own if facts is None else facts
    names = {name for name, _ in facts}
    if len(names) > 1:
        raise DepthlensError(
            f"the checkpoints use different tokenizers ({', '.join(sorted(names))}); "
            "a study compares them on one eval set"
        )
    max_len = min(m for _, m in facts)
    data = eval_set(
        opts.data,
        toks[0],
        max_seq_len=max_len,
        n_seq=opts.n_seq,
        seq_len=opts.seq_len,
        tokens=opts.tokens,
        seed=opts.seed,
    )
    check_models(entries, data)
    return data


def check_models(entries: Sequence[Entry | Loaded], data: EvalData) -> None:
    """Every model can read `data` (its vocabulary holds every token id, its context the sequence length)."""
    for e in entries:
        try:
            data.check_model(e.model.config.vocab_size, e.model.config.max_seq_len)
        except DepthlensError as err:
            raise type(err)(f"{e.path}: {err}") from None


# ---------------------------------------------------------------------------------------------------------------
# 3. diagnostics


def tasks(entries: Sequence[Entry], opts: StudyOptions) -> list[tuple[Entry, str]]:
    """(checkpoint, diagnostic) pairs to run: the requested diagnostics that apply to each design."""
    return [(e, m) for e in entries for m in opts.metrics if applies(m, e)]


def applies(metric: str, e: Entry) -> bool:
    """Whether diagnostic `metric` applies to `e`'s design: by the registry's design capabilities, or, for a
    described model (its design is its own, not a registry slug), by those its description gives
    (`adapters.described.DescribedDesign.capabilities`: stream maps, AttnRes weights)."""
    d = registry.get(metric)
    if getattr(e.model, "adapter_path", None) == "described":  # whatever name it has, even a registry slug
        return d.requires is None or d.requires in e.model.design.capabilities
    return d.applies(e.slug)


def compute(entries: Sequence[Entry], data: EvalData, opts: StudyOptions, progress: Progress = _noop) -> None:
    """Fill `entry.datasets` (and `entry.untrained`) for every applicable metric, each from the result cache
    (`studies.cache`) when it holds it (`entry.from_cache` names those). A metric that is undefined for a model (a
    DepthlensError from the engine, e.g. too few layers for late pairs) is recorded as a note, not fatal."""
    import torch

    from .cache import ResultCache

    # Tiny models: one thread is much faster than two (13x for a permutation sweep at L = 16 with a busy
    # second core, and still faster on an idle machine), so the default is 1.
    prev = torch.get_num_threads()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        _compute(entries, data, opts, progress, ResultCache.for_study(opts.cache))
    finally:
        torch.set_num_threads(prev)


def _run_cached(
    cache: ResultCache, e: Entry, model: Any, metric: str, data: EvalData, opts: StudyOptions, untrained: str | None
) -> Any:
    """One engine result of `e` (its trained model, or its untrained twin `model` initialised as `untrained` says):
    from the cache, else computed (to `--precision` where asked and supported) and stored."""
    precise = not untrained and opts.precision is not None and registry.get(metric).name in precision_supported()
    options = opts.engine_options(metric)

    def run() -> Any:
        if precise:
            from .precision import to_precision

            assert opts.precision is not None
            return to_precision(metric, model, data, opts.precision, checkpoint=e.path, **options)
        return registry.run(metric, model, data, checkpoint=e.path, **options)

    key = cache.key(
        e.path,
        e.model,  # what was loaded from e.path (a described model is never cached, nor its twin)
        metric,
        data,
        options,
        untrained=untrained,
        precision=opts.precision if precise else None,
        device=opts.device,
        device_map=opts.device_map,
        dtype=opts.dtype,
    )
    ds, hit = cache.fetch(key, run)
    if hit:
        e.from_cache.append(metric if untrained is None else f"{metric} (untrained)")
    return ds


def _compute(
    entries: Sequence[Entry], data: EvalData, opts: StudyOptions, progress: Progress, cache: ResultCache
) -> None:
    import torch

    with torch.no_grad():
        for e, m in tasks(entries, opts):
            t0 = time.perf_counter()
            try:
                e.datasets[m] = _run_cached(cache, e, e.model, m, metric_data(data, m, opts), opts, None)
            except (DepthlensError, ValueError) as err:
                e.notes.append(f"{m}: not computed ({str(err).splitlines()[0]})")
            e.seconds[m] = round(time.perf_counter() - t0, 3)
            progress(f"{e.name}: {m}" + (" (cached)" if m in e.from_cache else ""))
        if not opts.late:  # compare and sweep read only the trained headline
            for e in entries:
                _compute_untrained(e, data, opts, cache)


def precision_supported() -> Mapping[str, str]:
    """The diagnostics `--precision` can grow to a target interval width, each with its headline score."""
    from .precision import supported

    return supported()


def untrained_model(e: Entry) -> Any:
    """The model of `e`'s config as the trainer initialises it for `e`'s training seed (`build_model(config,
    seed)`, exactly the trainer's step-0 weights), on `e`'s device and dtype; a described model's own init
    (`untrained_of`); None when there is none."""
    return untrained_of(e)[0]


def untrained_of(e: Entry) -> tuple[Any, str]:
    """(the untrained model of `e` or None, how it was initialised or why there is none), on `e`'s device and dtype.

    depthlens checkpoints: the trainer's step-0 weights for the training seed. Described models (FILE.py:FUNCTION
    with weights: depthlens did not train them, so no seed is recorded): FUNCTION's own init under the fixed torch
    seed `adapters.described.TWIN_SEED`, no weights loaded."""
    from depthlens.adapters.twin import untrained_twin
    from depthlens.models.config import ModelConfig

    if getattr(e.model, "adapter_path", None) == "described":
        from depthlens.adapters.described import TWIN_SEED, untrained_init

        try:
            return untrained_twin(e.model, seed=TWIN_SEED), untrained_init(TWIN_SEED)
        except DepthlensError as err:
            return None, str(err).splitlines()[0]
    if e.seed is None or not isinstance(getattr(e.model, "config", None), ModelConfig):
        return None, "no training seed in train.json"
    return untrained_twin(e.model, seed=e.seed), f"the trainer's step-0 weights, seed {e.seed}"


def metric_data(data: EvalData, metric: str, opts: StudyOptions, untrained: bool = False) -> EvalData:
    """The eval data a diagnostic runs on: all of it, or a prefix of the sequences for the permutation
    (`perm_n_seq`, `untrained_perm_n_seq`; an untrained run never sees more than the trained one)."""
    import dataclasses

    caps = registry.get(metric).seq_caps
    if not caps:
        return data
    ks = [k for k in (getattr(opts, caps[0]), getattr(opts, caps[1]) if untrained else None) if k]
    if not ks or min(ks) >= data.n_seq:
        return data
    return dataclasses.replace(data, tokens=data.tokens[: min(ks)])


def _compute_untrained(e: Entry, data: EvalData, opts: StudyOptions, cache: ResultCache | None = None) -> None:
    from depthlens.stats.orderings import claim_cells

    from .cache import ResultCache

    cache = cache if cache is not None else ResultCache.for_study(opts.cache)

    # the baseline of what was computed on the trained model (a refusal there is noted once, not twice)
    todo = [m for m in opts.metrics if m in opts.untrained and applies(m, e) and m in e.datasets]
    if todo and not opts.has_twin(e.seed):
        k = opts.untrained_seeds
        e.notes.append(f"untrained baseline: not computed (--untrained-seeds {k}: training seed {e.seed} is not < {k})")
        return
    for m in [m for m in todo if registry.get(m).untrained_where_claimed and opts.untrained_perm_for == "claims"]:
        if (e.slug, e.n_layer) not in claim_cells(registry.get(m).prefix):
            todo.remove(m)
            e.notes.append(
                f"{m} (untrained): not computed (--untrained-perm-for claims: a {m} claim does not name this design and depth)"
            )
    if not todo:
        return
    model, how = untrained_of(e)
    if model is None:
        e.notes.append(f"untrained baseline: not computed ({how})")
        return
    e.untrained_init = how
    if getattr(e.model, "adapter_path", None) == "described":  # not the trainer's step 0: say what it is
        e.notes.append(f"untrained baseline: {how} (FUNCTION() with no weights loaded)")
    t0 = time.perf_counter()
    for m in todo:
        try:
            e.untrained[m] = _run_cached(cache, e, model, m, metric_data(data, m, opts, untrained=True), opts, how)
        except (DepthlensError, ValueError) as err:
            e.notes.append(f"{m} (untrained): not computed ({str(err).splitlines()[0]})")
    e.seconds["untrained"] = round(time.perf_counter() - t0, 3)


# ---------------------------------------------------------------------------------------------------------------
# the whole study, in one process or spread over torchrun ranks


@dataclass(frozen=True)
class Callbacks:
    """What a study tells its caller along the way (`run_study`'s keywords, handed whole to its torchrun branch
    `compute_spread`): `before()` runs first (on rank 0 under torchrun: report checks its output location there),
    `on_loaded(n_steps)` once the models are validated, `progress(what)` after each step."""

    before: Callable[[], object] | None = None
    progress: Progress = _noop
    on_loaded: Callable[[int], None] | None = None


def compute_spread(
    paths: Sequence[str | os.PathLike[str]], opts: StudyOptions, calls: Callbacks
) -> tuple[list[Entry], Any, float, int] | None:
    """Steps 1-4 under torchrun, each rank on whole checkpoints of its own (runtime.ranks). Rank 0 returns
    (every Entry in the given order, eval data, compute seconds, world size), the other ranks None. After each
    step every rank `agree`s ok/error, so one failing rank stops them all with its line."""
    from depthlens.runtime.distributed import (
        agree,
        device_for_rank,
        gather_to_main,
        local_only,
        long_wait_group,
        world,
    )
    from depthlens.runtime.ranks import assign, attempt, pack, unpack

    group = long_wait_group()
    rank, n = world()
    paths = [Path(p) for p in paths]

    def plan() -> list[int]:
        if calls.before is not None:
            calls.before()
        return assign(paths, n)

    def load() -> tuple[list[Entry], list[tuple[str, int]]]:
        own = load_entries(
            paths, device=device_for_rank(opts.device), only=mine, dtype=opts.dtype, device_map=opts.device_map
        )
        return own, tokenizer_facts(own, opts)[1]

    # 1. rank 0 runs `before` (report: checks --out) and assigns the models (every rank uses its assignment)
    err, owner = attempt(plan) if rank == 0 else (None, None)
    mine = [i for i, r in enumerate(agree(err, owner, group)[0]) if r == rank]
    # 2. load my checkpoints; every rank builds the eval data one process builds, from the whole set's facts
    err, loaded = attempt(load)
    entries, facts = loaded or ([], [])
    facts = [f for part in agree(err, facts, group) for f in part]
    err, data = attempt(lambda: study_eval_data(entries, opts, facts=facts) if entries else None)
    hashes = {h for h in agree(err, None if data is None else data.sha256, group) if h is not None}
    if len(hashes) > 1:  # identical inputs must give identical tokens: never compare checkpoints on different data
        raise DepthlensError(f"the ranks built different eval data ({len(hashes)} token hashes)")
    if calls.on_loaded is not None:
        calls.on_loaded(n_steps(entries, opts, n_checkpoints=len(paths)))
    # 3. every diagnostic on my checkpoints; the engines must not split their arms over the ranks again
    t0 = time.perf_counter()
    with local_only():
        err, _ = attempt(lambda: compute(entries, data, opts, calls.progress))
    agree(err, None, group)
    # 4. records and datasets to rank 0
    parts = gather_to_main([(i, pack(e)) for i, e in zip(mine, entries)], group)
    if parts is None:
        return None
    done = dict(p for part in parts for p in part)
    return [Entry(**unpack(done[i])) for i in range(len(paths))], data, time.perf_counter() - t0, n


def n_steps(entries: Sequence[Entry], opts: StudyOptions, n_checkpoints: int | None = None) -> int:
    """Progress steps of `build_report` after loading: metric runs of `entries` (rank 0's share under
    torchrun), figures per checkpoint (all n_checkpoints), summary, cross-checkpoint figures, write."""
    return len(tasks(entries, opts)) + (len(entries) if n_checkpoints is None else n_checkpoints) + 3


@dataclass
class Study:
    """What `run_study` computed: every model's Entry (in the given order), the eval data, compute seconds and
    the number of processes that computed it (provenance only: results do not depend on it)."""

    entries: list[Entry]
    data: Any  # EvalData
    seconds: float
    world_size: int = 1
    cache: str | None = None  # the result cache's folder; None: off

    def cache_line(self) -> str:
        """One line for the terminal and the provenance: how many results were computed, how many read from the
        result cache (and its folder)."""
        from .cache import Tally

        tally = Tally(self.cache)
        for e in self.entries:
            tally.add(*results_of(e))
        return tally.line()


def results_of(e: Entry) -> tuple[int, int]:
    """(engine results `e` holds, trained and untrained; how many of them came from the result cache)."""
    return len(e.datasets) + len(e.untrained), len(e.from_cache)


def each_computed(
    paths: Sequence[str | os.PathLike[str]], data: EvalData, opts: StudyOptions, progress: Progress = _noop
) -> Iterator[Entry]:
    """A study on given eval data with one model in memory at a time (track: every snapshot of a run): each path
    loaded, checked against `data` (the eval-set rule's check), computed (`compute`: the result cache first),
    yielded; the caller drops it before the next is loaded."""
    for p in paths:
        entries = load_entries([p], device=opts.device, dtype=opts.dtype, device_map=opts.device_map)
        check_models(entries, data)
        compute(entries, data, opts, progress)
        yield entries[0]


def run_study(
    paths: Sequence[str | os.PathLike[str]],
    opts: StudyOptions,
    *,
    before: Callable[[], object] | None = None,
    progress: Progress = _noop,
    on_loaded: Callable[[int], None] | None = None,
) -> Study | None:
    """Load every model, build the shared eval data, run every applicable diagnostic. `before` runs first (on
    rank 0 under torchrun; report checks its output location there), `on_loaded(n_steps)` once the models are
    validated. Under torchrun the ranks other than 0 return None."""
    from depthlens.runtime.distributed import launched

    from .cache import folder_in_use

    if launched():
        spread = compute_spread(paths, opts, Callbacks(before, progress, on_loaded))
        if spread is None:
            return None
        entries, data, seconds, world_size = spread
        return Study(entries, data, seconds, world_size, folder_in_use(opts.cache))
    if before is not None:
        before()
    entries = load_entries(paths, device=opts.device, dtype=opts.dtype, device_map=opts.device_map)
    data = study_eval_data(entries, opts)
    if on_loaded is not None:
        on_loaded(n_steps(entries, opts))
    t0 = time.perf_counter()
    compute(entries, data, opts, progress)
    return Study(entries, data, time.perf_counter() - t0, cache=folder_in_use(opts.cache))

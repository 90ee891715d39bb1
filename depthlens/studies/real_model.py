"""The real-model study: every Pre-LN diagnostic on one pretrained model, in named stages, then its summary.

    run = compute(RealModelOptions(Path("model.gguf"), Path("reports/smollm2")), on_stage=RunRecord(...).save)
    summary = summarise(Path("reports/smollm2"), run)      # every number, read back from the stage files

A `Stage` is one dataset, `<out>/data/<name>.nc`: what it computes, on which model (the trained one, or one of
its twins of `adapters/twin.py`: the untrained and shuffled stages are the trained stages' computations on
another model, not a loop of their own), the stage files it needs (refused without them) or uses when they are
there, and, for the pruning stages, the criteria it computes, so that a kept file is extended by the criteria
whose input stage came later. `compute` runs the chosen stages in `STAGES` order on the study's one eval set
(`study.study_eval_data`, the rule of every study), keeps a stage whose file is there under `resume`, writes each
file atomically as soon as it is done and hands the costs so far to `on_stage`. scripts/real_model_report.py is the
command over it (its docstring lists the stages for a user).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError, UsageError

if TYPE_CHECKING:
    import xarray as xr

    from depthlens.adapters.load import Opened
    from depthlens.runtime.evaldata import EvalData
    from depthlens.runtime.progress import ProgressFn

N_RANDOM = 3  # random-removal draws per k in the (in-sample) pruning stage (mean, min and max are reported)
N_RANDOM_HELDOUT = 20  # random draws per k and baseline (uniform, stratified) in the pruning_random stage
REFERENCE_N_SEQ, REFERENCE_SEQ_LEN = 8, 128  # the eval set of the reference measurements quoted in issue 10
# a pruning criterion computed from another stage's dataset, and that stage (the others need only the model)
CRITERION_INPUT = {"causal": "causal_update", "permutation": "permutation"}

# what shows a long step: (what, least seconds between two plain lines) -> a context yielding the engines'
# progress callback, or None (silent: the package's default; the command passes its terminal bar)
Show = Callable[[str, float], AbstractContextManager["ProgressFn | None"]]


@contextmanager
def _silent(_what: str, _every: float) -> Iterator[ProgressFn | None]:
    yield None


@dataclass(frozen=True)
class RealModelOptions:
    """What the real-model study computes, and on what."""

    model: Path  # a GGUF file or model directory
    out: Path  # the report directory: stage files go to <out>/data/
    n_seq: int = 4
    seq_len: int = 64
    seed: int = 0
    threads: int = 2  # torch CPU threads while computing
    resume: bool = False  # keep the stage files already there
    stages: tuple[str, ...] = ()  # () = DEFAULT_STAGES
    k_max_heldout: int = 0  # pruning_heldout / pruning_random: the largest k (0: L/2)
    heldout_criteria: tuple[str, ...] = ()  # pruning_heldout's criteria (): every one
    command: str | None = None  # each stage dataset's `command` attribute (how to reproduce it)

    @property
    def data_dir(self) -> Path:
        return self.out / "data"

    def chosen(self) -> tuple[str, ...]:
        return self.stages or DEFAULT_STAGES


class Context:
    """One model opened for the study, its eval set and its twins, built on first use."""

    def __init__(self, opts: RealModelOptions, opened: Opened, data: EvalData):
        self.opts, self.opened, self.data = opts, opened, data
        self.model = opened.model
        self._models: dict[str, Any] = {"trained": opened.model}
        self._reference: list[EvalData] = []

    def path(self, stage: str) -> Path:
        return self.opts.data_dir / f"{stage}.nc"

    def has(self, stage: str) -> bool:
        return self.path(stage).exists()

    def load(self, stage: str) -> xr.Dataset:
        import xarray as xr

        return xr.load_dataset(self.path(stage))

    def load_if_there(self, stage: str) -> xr.Dataset | None:
        return self.load(stage) if self.has(stage) else None

    def model_of(self, kind: str) -> Any:
        """The trained model, or its `kind` twin (seed 0), built at its first stage (as that stage's cost)."""
        if kind not in self._models:
            from depthlens.adapters import twin

            build = {"untrained": twin.untrained_twin, "shuffled": twin.shuffled_twin}[kind]
            self._models[kind] = build(self.model, seed=0)
        return self._models[kind]

    def reference_data(self) -> EvalData:
        """The reference stage's eval set: the study's rule at REFERENCE_N_SEQ × REFERENCE_SEQ_LEN, seed 0."""
        if not self._reference:
            self._reference.append(eval_data(self.opts.model, self.model, REFERENCE_N_SEQ, REFERENCE_SEQ_LEN, 0))
        return self._reference[0]


@dataclass(frozen=True)
class Step:
    """What a stage's computation is handed: the study, the model it runs on, the progress callback, the criteria
    to compute (the extensible stages) and its journal folder (stages that keep their finished cuts)."""

    ctx: Context
    model: Any
    progress: ProgressFn | None
    criteria: tuple[str, ...] = ()
    journal: Path | None = None


@dataclass(frozen=True)
class Stage:
    """One stage: `<out>/data/<name>.nc`, computed by `compute` on the `model` (trained, untrained, shuffled)."""

    name: str
    compute: Callable[[Step], xr.Dataset]
    model: str = "trained"
    default: bool = False  # in the default list of stages
    needs: tuple[str, ...] = ()  # stage files it reads and cannot do without
    uses: tuple[str, ...] = ()  # stage files it reads when they are there
    # an extensible stage: the criteria it computes, given the stage files there now, and how a kept file takes
    # the ones it lacks (the kept file's criteria: its `criteria_json` attribute)
    criteria: Callable[[Context], list[str]] | None = None
    merge: Callable[[xr.Dataset, xr.Dataset], xr.Dataset] | None = None
    journal: bool = False  # its finished cuts are kept in data/journal/<name>/ until the file is written


# ---------------------------------------------------------------------------------------------------------------
# the computations


def _angular(step: Step) -> xr.Dataset:
    ctx = step.ctx
    return registry.run(
        "angular", step.model, ctx.data, positions="all", checkpoint=ctx.opts.model, progress=step.progress
    )


def _permutation(step: Step) -> xr.Dataset:
    ctx = step.ctx
    return registry.run(
        "permutation", step.model, ctx.data, pairs="late", checkpoint=ctx.opts.model, progress=step.progress
    )


def _causal(step: Step, *, norm: str, layers: str = "late", reference: bool = False) -> xr.Dataset:
    """C(s,t) under `norm`, the current variant on `layers` (all: with the output effect, ΔL_skip(s) and the
    per-sequence clean loss) and the future variant on the late s, stacked along `variant`."""
    import xarray as xr

    ev = step.ctx.reference_data() if reference else step.ctx.data
    progress, full = step.progress, layers == "all"
    first = [0]  # skip runs of the current-variant run: the future run's count continues from there

    def current(done: int, total: int) -> None:
        first[0] = total
        if progress is not None:
            progress(done, total)

    def future(done: int, total: int) -> None:
        if progress is not None:
            progress(first[0] + done, first[0] + total)

    cur = registry.run(
        "causal",
        step.model,
        ev,
        variants=("current",),
        layers=layers,
        norm=norm,
        outputs=full,
        progress=current if progress else None,
    )
    fut = registry.run(
        "causal",
        step.model,
        ev,
        variants=("future",),
        layers="late",
        norm=norm,
        outputs=False,
        progress=future if progress else None,
    )
    keep = [
        v
        for v in (
            "causal_score",
            "null_score",
            "seq_max",
            "seq_sum",
            "seq_count",
            "seq_sq_change",
            "seq_sq_update",
            "mean_downstream_effect",
        )
        if v in cur and v in fut
    ]
    both = xr.concat([cur[keep], fut[keep]], dim="variant", combine_attrs="override")
    for v in ("output_effect", "output_effect_seq", "skip_delta_loss", "skip_delta_loss_seq", "clean_loss_seq"):
        if v in cur:
            both[v] = cur[v]
    both.attrs.update(
        variants_json='["current", "future"]',
        layers_current_json=cur.attrs["layers_json"],
        layers_future_json=fut.attrs["layers_json"],
        cut_positions_json=fut.attrs["cut_positions_json"],
    )
    return both


def _with_inputs(ctx: Context, every: Sequence[str]) -> list[str]:
    """The criteria of `every` whose input stage is there (the others need only the model)."""
    return [c for c in every if c not in CRITERION_INPUT or ctx.has(CRITERION_INPUT[c])]


def _pruning_criteria(ctx: Context) -> list[str]:
    from depthlens.diagnostics.pruning import CRITERIA

    return _with_inputs(ctx, CRITERIA)


def _pruning(step: Step) -> xr.Dataset:
    from depthlens.diagnostics.pruning import pruning_curves

    ctx = step.ctx
    return pruning_curves(
        step.model,
        ctx.data,
        angular=ctx.load("angular"),
        causal=ctx.load("causal_update"),
        permutation=ctx.load_if_there("permutation"),
        criteria=list(step.criteria),
        n_random=N_RANDOM,
        checkpoint=ctx.opts.model,
    )


def _add_criteria(kept: xr.Dataset, new: xr.Dataset) -> xr.Dataset:
    from depthlens.diagnostics.pruning import add_criteria

    return add_criteria(kept, new)


def _heldout_criteria(ctx: Context) -> list[str]:
    from depthlens.diagnostics.pruning_heldout import CRITERIA

    return _with_inputs(ctx, ctx.opts.heldout_criteria or CRITERIA)


def _heldout_settings(step: Step) -> dict[str, Any]:
    """What the two held-out pruning stages (the criteria's curves, the random cuts) both hand their engine: the
    largest k (`--k-max`), the checkpoint (provenance), the progress callback and the journal of finished cuts."""
    return {
        "k_max": step.ctx.opts.k_max_heldout or None,
        "checkpoint": step.ctx.opts.model,
        "progress": step.progress,
        "journal": step.journal,
    }


def _heldout(step: Step) -> xr.Dataset:
    from depthlens.diagnostics.pruning_heldout import heldout_curves, window_domains

    ctx, todo = step.ctx, step.criteria
    return heldout_curves(
        step.model,
        ctx.data,
        domains=window_domains(ctx.data, ctx.opened.tokenizer),
        criteria=list(todo),
        causal=ctx.load(CRITERION_INPUT["causal"]) if "causal" in todo else None,
        permutation=ctx.load(CRITERION_INPUT["permutation"]) if "permutation" in todo else None,
        **_heldout_settings(step),
    )


def _merge_heldout(kept: xr.Dataset, new: xr.Dataset) -> xr.Dataset:
    from depthlens.diagnostics.pruning_heldout import merge_heldout

    return merge_heldout(kept, new)


def _random_cuts(step: Step) -> xr.Dataset:
    from depthlens.diagnostics.pruning_heldout import random_baselines

    return random_baselines(step.model, step.ctx.data, n_random=N_RANDOM_HELDOUT, **_heldout_settings(step))


def _on_twin(kind: str, *, default: bool) -> tuple[Stage, Stage]:
    """The controls on twin `kind`: the trained stages causal_update (on the late s only) and permutation, run on
    the twin instead of the trained model."""
    return (
        Stage(f"{kind}_causal_update", partial(_causal, norm="update"), model=kind, default=default),
        Stage(f"{kind}_permutation", _permutation, model=kind, default=default),
    )


TWIN_KINDS = ("untrained", "shuffled")  # adapters/twin.py: a fresh init of the config; the weights shuffled

# every stage, in the order they are computed (a stage that reads another's file comes after it)
STAGES: tuple[Stage, ...] = (
    Stage("angular", _angular, default=True),
    Stage("causal_update", partial(_causal, norm="update", layers="all"), default=True),
    Stage("causal_resid", partial(_causal, norm="resid"), default=True),
    Stage("permutation", _permutation, default=True),
    *_on_twin("untrained", default=True),
    *_on_twin("shuffled", default=False),  # the second control, computed when asked
    Stage(
        "pruning",
        _pruning,
        needs=("angular", "causal_update"),
        uses=("permutation",),
        criteria=_pruning_criteria,
        merge=_add_criteria,
    ),
    Stage(
        "pruning_heldout",
        _heldout,
        uses=("causal_update", "permutation"),
        criteria=_heldout_criteria,
        merge=_merge_heldout,
        journal=True,
    ),
    Stage("pruning_random", _random_cuts, journal=True),
    Stage("reference", partial(_causal, norm="update", reference=True)),
)
BY_NAME = {s.name: s for s in STAGES}
DEFAULT_STAGES = tuple(s.name for s in STAGES if s.default)
OPTIONAL_STAGES = tuple(s.name for s in STAGES if not s.default)
TWIN_CONTROLS = tuple(s.name for s in STAGES if s.model == "shuffled")  # summarised when computed


def parse_stages(spec: str) -> tuple[str, ...]:
    """'a,b' → the stage names as given; UsageError naming the unknown ones."""
    stages = tuple(x.strip() for x in spec.split(",") if x.strip())
    unknown = sorted(set(stages) - set(BY_NAME))
    if unknown:
        raise UsageError(f"--stages: unknown {unknown}; choose from {', '.join(DEFAULT_STAGES + OPTIONAL_STAGES)}")
    return stages


# ---------------------------------------------------------------------------------------------------------------
# the runner


def eval_data(path: Path, model: Any, n_seq: int, seq_len: int, seed: int) -> EvalData:
    """The study's eval set for one model (`study.study_eval_data`: the default held-out corpus, the model's
    tokenizer, checked against the model)."""
    from .study import Loaded, StudyOptions, study_eval_data

    return study_eval_data([Loaded(path, model)], StudyOptions(n_seq=n_seq, seq_len=seq_len, seed=seed))


def _peak_rss() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def _kept_criteria(path: Path) -> list[str]:
    import xarray as xr

    with xr.open_dataset(path) as ds:
        return list(json.loads(ds.attrs["criteria_json"]))


def compute(
    opts: RealModelOptions,
    *,
    on_stage: Callable[[dict[str, Any]], None] | None = None,
    show: Show = _silent,
) -> dict[str, Any]:
    """Compute the chosen stages that are missing; returns the run record (costs, provenance, eval size).
    `on_stage(record)` after each stage written (the caller saves run.json, so a killed run keeps the costs of
    the stages it finished); `show(what, every)` shows the load and each stage."""
    import torch

    chosen = opts.chosen()
    unknown = sorted(set(chosen) - set(BY_NAME))
    if unknown:
        raise UsageError(f"unknown stages {unknown}; choose from {', '.join(BY_NAME)}")
    prev = torch.get_num_threads()
    torch.set_num_threads(opts.threads)
    try:
        return _compute(opts, chosen, on_stage, show)
    finally:
        torch.set_num_threads(prev)


def _compute(
    opts: RealModelOptions,
    chosen: tuple[str, ...],
    on_stage: Callable[[dict[str, Any]], None] | None,
    show: Show,
) -> dict[str, Any]:
    from depthlens.adapters.load import open_model
    from depthlens.io.dataset import write_netcdf

    data_dir = opts.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with show(f"loading {opts.model.name}", 5.0) as progress:  # a GGUF is dequantised tensor by tensor (~1 min)
        opened = open_model(opts.model, progress=progress)
    ctx = Context(opts, opened, eval_data(opts.model, opened.model, opts.n_seq, opts.seq_len, opts.seed))
    # a later process on a kept record names its load after its stages, so the first load's cost is not replaced
    run_file = data_dir / "run.json"
    kept = json.loads(run_file.read_text()) if opts.resume and run_file.exists() else {}
    load = f"load ({', '.join(chosen)} run)" if "load" in kept.get("seconds", {}) else "load"
    seconds = {load: round(time.time() - t0, 1)}
    costs = {load: {"wall_s": seconds[load], "cpu_s": round(time.process_time(), 1), "peak_rss_mib": _peak_rss()}}

    def record() -> dict[str, Any]:
        return {
            "seconds": dict(seconds),
            "costs": dict(costs),
            "provenance": dict(opened.provenance.items()),
            "n_seq": ctx.data.n_seq,
            "seq_len": ctx.data.seq_len,
            "seed": opts.seed,
            "threads": opts.threads,
            "n_layer": int(ctx.model.n_layer),
            "family": opened.meta.family,
        }

    for stage in STAGES:
        if stage.name not in chosen:
            continue
        path = ctx.path(stage.name)
        journal = data_dir / "journal" / stage.name if stage.journal else None
        # an extensible stage computes the criteria a kept file lacks (all of them when there is none)
        kept_criteria = _kept_criteria(path) if stage.criteria and opts.resume and path.exists() else []
        todo = [c for c in stage.criteria(ctx) if c not in kept_criteria] if stage.criteria else []
        extends = bool(kept_criteria and todo)
        if opts.resume and path.exists() and not (stage.criteria and todo):
            print(f"[{stage.name}] kept {path}", flush=True)
        else:
            lacking = [n for n in stage.needs if not ctx.has(n)]
            if lacking:
                raise DepthlensError(
                    f"{stage.name}: run the stages {', '.join(lacking)} first (their rankings pick the layers)"
                )
            if journal is not None and not opts.resume:  # a fresh run computes every cut again
                shutil.rmtree(journal, ignore_errors=True)
            t, cpu = time.time(), time.process_time()
            with show(stage.name, 10.0) as progress:  # a bar on a terminal, a line every 10 s in a log
                step = Step(ctx, ctx.model_of(stage.model), progress, tuple(todo), journal)
                ds = stage.compute(step)
                if extends:
                    assert stage.merge is not None
                    ds = stage.merge(ctx.load(stage.name), ds)
            if opts.command is not None:
                ds.attrs["command"] = opts.command
            write_netcdf(ds, path, overwrite=True)
            # an extension of a kept stage records its own cost beside the first run's
            key = f"{stage.name} (+{', '.join(todo)})" if extends else stage.name
            seconds[key] = round(time.time() - t, 1)
            # the process's peak resident memory so far (ru_maxrss never falls: a stage's own peak is at most this)
            costs[key] = {
                "wall_s": seconds[key],
                "cpu_s": round(time.process_time() - cpu, 1),
                "peak_rss_mib": _peak_rss(),
            }
            print(f"[{stage.name}] {seconds[key]} s -> {path}", flush=True)
            if on_stage is not None:
                on_stage(record())
        if journal is not None and path.exists():  # the stage's dataset is written: its journal is spent
            shutil.rmtree(journal, ignore_errors=True)
    return record()


class RunRecord:
    """`<out>/data/run.json`, shared by every process computing stages of one model.

    Each save merges this process's stages into the record on disk *now*, under a lock, so runs on disjoint
    stages in parallel (one per core) keep each other's costs; reading the record once at start would let the
    last writer drop the stages the other finished meanwhile. `wall_seconds` is the resumed total: what is on
    disk, less this process's earlier contribution, plus its elapsed time.
    """

    def __init__(self, path: Path, *, resume: bool):
        self.path, self.resume = path, resume
        self.started = time.time()
        self.added = 0.0  # wall seconds this process has already put into the record's total

    def save(self, run: dict[str, Any]) -> None:
        import filelock

        from depthlens.io.atomic import atomic_write_text

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.path.parent / f".{self.path.name}.lock"), timeout=120):
            disk = json.loads(self.path.read_text()) if self.path.exists() else {}
            run["seconds"] = {**disk.get("seconds", {}), **run["seconds"]}
            run["costs"] = {**disk.get("costs", {}), **run.get("costs", {})}
            elapsed = round(time.time() - self.started, 1)
            base = disk.get("wall_seconds", 0.0) - self.added if self.resume else 0.0
            run["wall_seconds"] = round(base + elapsed, 1)
            self.added = elapsed
            atomic_write_text(self.path, json.dumps(run, indent=1, default=str))


# ---------------------------------------------------------------------------------------------------------------
# the summary


def summarise(out: Path, run: dict[str, Any]) -> dict[str, Any]:
    """Every number of the report, from the stage datasets present (missing stages are listed, not faked)."""
    import xarray as xr

    from depthlens.diagnostics.sweep import headline, paired_share_difference
    from depthlens.stats.metrics import late_window

    from .sensitivity import PAPER_REFERENCE, causal_definition_table, permutation_definition_table

    causal_key, causal_theta = registry.CAUSAL.key, registry.CAUSAL.theta
    perm_key, perm_theta = registry.PERM_ABS.key, registry.PERM_ABS.theta
    d = {
        name: xr.load_dataset(out / "data" / f"{name}.nc")
        for name in (*DEFAULT_STAGES, *TWIN_CONTROLS)
        if (out / "data" / f"{name}.nc").exists()
    }
    causal = {n: d[f"causal_{n}"] for n in ("update", "resid") if f"causal_{n}" in d}
    perm = d.get("permutation")
    L = int(run["n_layer"])
    heads = {}
    if "update" in causal:
        heads[causal_key] = headline(causal["update"], causal_key, causal_theta, n_boot=200, seed=0)
    if perm is not None:
        heads["permutation"] = headline(perm, perm_key, perm_theta, n_boot=200, seed=0)
    cu = causal.get("update")

    def twin_headlines(kind: str) -> dict[str, Any]:
        """A twin's headlines, and trained − twin paired over the same eval sequences (the `untrained_*` or
        `shuffled_*` stages; empty when not computed)."""
        out: dict[str, Any] = {}
        for key, trained, twin, metric, theta in (
            ("causal", cu, d.get(f"{kind}_causal_update"), causal_key, causal_theta),
            ("permutation", perm, d.get(f"{kind}_permutation"), perm_key, perm_theta),
        ):
            if trained is None or twin is None:
                continue
            diff = paired_share_difference(trained, twin, metric, theta, n_boot=200, seed=0)
            if diff is None:  # the engines store per-sequence values: a dataset without them is not theirs
                raise DepthlensError(f"{kind}_{key}: no per-sequence values of {metric} to pair with the trained model")
            out[key] = {
                **headline(twin, metric, theta, n_boot=200, seed=0),
                "trained_minus_untrained": diff.estimate,  # trained − this twin
                "diff_ci_low": diff.low,
                "diff_ci_high": diff.high,
                "diff_ci_method": diff.method,  # names its pairing
            }
        return out

    a = late_window(L)
    return {
        **run,
        "late_window_start": a,
        "n_late_pairs": (L - a) * (L - a - 1) // 2,
        "headlines": heads,
        **{f"{kind}_twin": twin_headlines(kind) for kind in TWIN_KINDS},
        "missing_stages": [x for x in DEFAULT_STAGES if x not in d],
        "causal_definitions": causal_definition_table(causal, thresholds=(causal_theta,)),
        "permutation_definitions": permutation_definition_table(perm, thresholds=(perm_theta,))
        if perm is not None
        else [],
        "paper_reference": PAPER_REFERENCE,
        "noise_floor": {
            n: {v: float(ds["null_score"].sel(variant=v)) for v in ds["variant"].values}
            for n, ds in causal.items()
            if "null_score" in ds
        },
        "clean_loss": float(perm["clean_loss"]) if perm is not None else None,
        "skip_delta_loss": [float(x) for x in cu["skip_delta_loss"].values] if cu is not None else None,
        "output_effect": [float(x) for x in cu["output_effect"].sel(variant="current").values]
        if cu is not None
        else None,
        "angular_d1": [float(x) for x in d["angular"]["profile"].values[:L]] if "angular" in d else None,
        "reference_8x128": _reference(out, causal_theta),
    }


def _reference(out: Path, theta: float) -> list[dict[str, Any]] | None:
    """The issue-10 reference table (8 × 128 tokens, norm=update) when the `reference` stage was run."""
    import xarray as xr

    from .sensitivity import causal_definition_table

    path = out / "data" / "reference.nc"
    if not path.exists():
        return None
    return causal_definition_table({"update": xr.load_dataset(path)}, thresholds=(theta,))


def render(
    out: Path, run: dict[str, Any], *, calibration: Path | None = None, report_name: str | None = None
) -> dict[str, Any]:
    """summary.json, the figures and README.md of `out` (and the calibration page, when given) from its stage
    files; returns the summary."""
    from .sensitivity import render_real_model_report

    summary = summarise(out, run)
    render_real_model_report(out, summary, calibration=calibration, report_name=report_name)
    return summary


def missing_defaults(out: Path) -> list[str]:
    """The default stages whose file is not under `out`/data."""
    return [x for x in DEFAULT_STAGES if not (out / "data" / f"{x}.nc").exists()]

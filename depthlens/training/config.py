"""RunConfig: everything that determines a training run, loaded from a JSON recipe + `key=value` overrides.

A recipe is either one RunConfig as a JSON object, or a grid of named runs sharing a base:

    {"description": "...", "base": {...RunConfig fields...}, "runs": {"preln_l4": {...overrides...}, ...}}

Overrides deep-merge into `model` (so a run only names the fields it changes). `load_recipe(path, run=...)`
picks one run; a single-run recipe needs no name. Every field says why it exists.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.config import ModelConfig

SCHEDULES = ("wsd", "cosine")
RUN_FILES = ("resume", ".resume.new", ".resume.old", "log.jsonl", "snapshots")  # what <out> holds besides the export
DTYPES = ("fp32", "bf16")

# Fields that shape the optimisation trajectory: a resume must match them exactly (micro_batch and the
# world size may differ, because the data order and the averaged gradient do not depend on them).
TRAJECTORY_FIELDS = ("model", "data", "tokenizer", "seq_len", "global_batch", "steps", "lr", "min_lr_factor",
                     "warmup", "schedule", "decay_frac", "weight_decay", "decay_mixing", "betas", "eps", "grad_clip", "seed",
                     "data_seed", "dtype")


@dataclass
class RunConfig:
    """One training run of a DepthModel (validated on construction)."""

    # --- what to train on -----------------------------------------------------------------------
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields: the architecture is data, not code
    data: str = "data/corpus-bytes"  # directory of token shards (train_*.bin / val_*.bin + manifest.json)
    tokenizer: str = "bytes"  # tokenizer spec (get_tokenizer); must match the shards, exported with the checkpoint
    seq_len: int = 128  # tokens per training sequence (inputs; targets are shifted by one)

    # --- batch ----------------------------------------------------------------------------------
    global_batch: int = 16  # sequences per optimizer step over all ranks: the unit the data order is defined in
    micro_batch: int = 0  # sequences per forward/backward on one rank (0 = global_batch / world: no accumulation)

    # --- optimisation ---------------------------------------------------------------------------
    steps: int = 100  # optimizer steps; with global_batch and seq_len it fixes the token budget
    lr: float = 3e-3  # peak learning rate: the one hyper-parameter swept per design
    min_lr_factor: float = 0.1  # final LR as a fraction of the peak (torchtitan's min_lr_factor)
    warmup: int = 10  # linear warmup steps from 0 (AdamW's second moment is unreliable early on)
    schedule: str = "wsd"  # "wsd" (warmup-stable-decay, torchtitan) or "cosine" (nanoGPT)
    decay_frac: float = 0.2  # WSD: fraction of steps in the final linear decay
    weight_decay: float = 0.1  # AdamW decoupled decay, applied to >= 2-D params only (not gains, not scalars)
    # Decay the residual design's own parameters (every parameter of a Router: HC static/dynamic maps, mHC
    # maps and biases, AttnRes queries, DeepNorm/KEEL/Sandwich gains) like weight matrices? Off, so every
    # design follows one recipe: decay shrinks an identity-initialised 2-D map (HC's static alpha: 0.809 I
    # after 400 steps at LR 6e-3) but not the same identity held in a 1-D bias (mHC). Zoo v2 had it on.
    decay_mixing: bool = False
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW moments (LLM-pretraining standard)
    eps: float = 1e-8  # AdamW epsilon
    grad_clip: float = 1.0  # global grad-norm clip (0 = off): protects early steps of deep models

    # --- reproducibility ------------------------------------------------------------------------
    seed: int = 0  # model init seed (identical on every rank, before wrapping)
    data_seed: int = 0  # data order seed: batch(step) depends only on (data_seed, step)

    # --- evaluation, logging, checkpoints -------------------------------------------------------
    eval_every: int = 0  # validate every N steps (0 = only at the end)
    eval_batches: int = 8  # validation batches (of global_batch sequences) per periodic eval (0 = whole val split)
    final_eval_batches: int = 0  # validation batches for the final, recorded loss (0 = whole val split)
    log_every: int = 1  # write a JSONL line every N steps (the first and last step are always logged)
    save_every: int = 0  # write the resume state every N steps (0 = only at the end)
    stop_after: int = 0  # stop after this step as if killed, leaving the resume state (0 = run to `steps`)
    resume: bool = True  # continue from <out>/resume if it exists (a preempted job just reruns its command)
    out: str = "runs/default"  # run directory: log.jsonl, resume/ state
    export: str = ""  # where the final depthlens checkpoint goes ("" = <out>/checkpoint)
    snapshots: list[int] = field(default_factory=list)  # steps at which to keep a model-only analysis snapshot (0 = init)
    snapshot_every_log2: bool = False  # snapshots at step 0, 16, 32, 64, ... and the last step: depth use over training
    snapshot_eval_batches: int = 4  # validation batches behind each snapshot's val_loss (cheap; the final eval is separate)
    name: str = ""  # run name recorded in train.json (the recipe's run key)
    meta: dict[str, Any] = field(default_factory=dict)  # free-form notes (iso-param target, planned counts) -> train.json

    # --- hardware -------------------------------------------------------------------------------
    device: str = "auto"  # "auto" (cuda if available), "cpu" or "cuda"
    dtype: str = "fp32"  # "fp32" or "bf16" (autocast; master weights and optimizer state stay fp32)
    compile: bool = False  # torch.compile the model: ~2x on GPU, but a 10-25 s cold start on CPU
    fsdp: bool = False  # FSDP2 fully_shard (per block, then root) instead of DDP: for memory, not speed
    threads: int = 0  # torch CPU threads (0 = leave torch's default); 1 avoids OpenMP stalls on shared CPUs

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)
        if isinstance(self.model, ModelConfig):
            self.model = self.model.to_dict()

        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ValueError(f"run config field {name!r}: {msg}")

        def pos_int(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            ok = isinstance(v, int) and not isinstance(v, bool) and (v >= 0 if allow_zero else v > 0)
            need(ok, name, f"must be a {'non-negative' if allow_zero else 'positive'} int, got {v!r}")

        need(isinstance(self.model, dict), "model", "must be an object of ModelConfig fields")
        self.model_config()  # validates the model fields (raises ValueError naming the field)
        for name in ("seq_len", "global_batch", "steps"):
            pos_int(name)
        for name in ("micro_batch", "warmup", "eval_every", "eval_batches", "final_eval_batches", "save_every",
                     "stop_after", "threads", "seed", "data_seed", "snapshot_eval_batches"):
            pos_int(name, allow_zero=True)
        pos_int("log_every")
        need(self.seq_len <= self.model_config().max_seq_len, "seq_len",
             f"{self.seq_len} exceeds model.max_seq_len={self.model_config().max_seq_len}")
        need(self.micro_batch == 0 or self.global_batch % self.micro_batch == 0, "micro_batch",
             f"must divide global_batch={self.global_batch}, got {self.micro_batch}")
        need(self.lr > 0 and math.isfinite(self.lr), "lr", f"must be positive, got {self.lr!r}")
        need(0 <= self.min_lr_factor <= 1, "min_lr_factor", f"must be in [0, 1], got {self.min_lr_factor!r}")
        need(self.warmup <= self.steps, "warmup", f"{self.warmup} exceeds steps={self.steps}")
        need(self.schedule in SCHEDULES, "schedule", f"must be one of {SCHEDULES}, got {self.schedule!r}")
        need(0 <= self.decay_frac <= 1, "decay_frac", f"must be in [0, 1], got {self.decay_frac!r}")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", f"must be two values in [0, 1), got {self.betas!r}")
        need(self.eps > 0, "eps", "must be positive")
        need(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")
        need(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        need(self.device in ("auto", "cpu", "cuda"), "device", f"must be auto, cpu or cuda, got {self.device!r}")
        need(bool(self.out), "out", "must name a run directory")
        need(isinstance(self.snapshots, list) and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= self.steps
                                                      for s in self.snapshots),
             "snapshots", f"must be a list of steps in [0, steps={self.steps}], got {self.snapshots!r}")
        need(isinstance(self.snapshot_every_log2, bool), "snapshot_every_log2", "must be true or false")
        out, export = Path(self.out).resolve(), self.export_dir.resolve()
        inside = out in export.parents  # fine only as a new entry of <out> (the default <out>/checkpoint)
        need(export != out and export not in out.parents and (not inside or (export.parent == out and
                                                                          export.name not in RUN_FILES)),
             "export", f"{self.export!r} would replace the run directory {self.out!r} or its resume state/log; "
             "export to a path of its own (or leave it empty for <out>/checkpoint)")

    # ---------------------------------------------------------------------------------------------
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.model)

    @property
    def export_dir(self) -> Path:
        return Path(self.export) if self.export else Path(self.out) / "checkpoint"

    @property
    def snapshot_steps(self) -> list[int]:
        """Sorted steps that get an analysis snapshot: the explicit list, plus (log2 mode) 0, 16, 32, ... < steps
        and the last step. Log-spaced because depth use changes fastest early in training."""
        steps = set(self.snapshots)
        if self.snapshot_every_log2:
            steps |= {0, self.steps} | {2 ** k for k in range(4, max(4, self.steps.bit_length())) if 2 ** k < self.steps}
        return sorted(steps)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def trajectory(self) -> dict[str, Any]:
        """The fields a resumed run must share with the run that wrote the state (model fully resolved)."""
        d = self.to_dict()
        d["model"] = self.model_config().resolved().to_dict()
        return {k: d[k] for k in TRAJECTORY_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunConfig:
        from depthlens.models.config import check_fields

        check_fields(cls, d, "run config")
        return cls(**copy.deepcopy(dict(d)))


# -------------------------------------------------------------------------------------------------
# recipes and overrides


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`; nested dicts (the `model` block) merge key by key."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else copy.deepcopy(v)
    return out


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings -> a nested dict. Values parse as JSON when they can (3e-3, true, [0.9,0.95]),
    else stay strings; dotted keys reach into the model block (`model.n_layer=8`)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def recipe_runs(recipe: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every run of a recipe as a full RunConfig dict (base merged), keyed by run name."""
    if "runs" not in recipe:
        return {str(recipe.get("name", "") or "run"): {k: v for k, v in recipe.items() if k != "description"}}
    base = recipe.get("base", {})
    runs = {}
    for name, over in recipe["runs"].items():
        cfg = deep_merge(base, over)
        cfg.setdefault("name", name)
        runs[name] = cfg
    return runs


def read_recipe(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: recipe not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe is a JSON object")
    return data


def load_recipe(path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = (),
                run: str | None = None) -> RunConfig:
    """RunConfig from a recipe file (+ overrides). A grid recipe needs `run` (one of its run names)."""
    recipe = read_recipe(path)
    runs = recipe_runs(recipe)
    if run is None:
        if len(runs) != 1:
            raise ValueError(f"{path}: recipe has {len(runs)} runs; pick one with --run ({', '.join(list(runs)[:5])}, ...)")
        run = next(iter(runs))
    if run not in runs:
        raise ValueError(f"{path}: no run named {run!r}")
    over = parse_overrides(overrides) if not isinstance(overrides, Mapping) else dict(overrides)
    return RunConfig.from_dict(deep_merge(runs[run], over))

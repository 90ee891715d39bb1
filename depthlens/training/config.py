"""RunConfig: everything that determines a training run, loaded from a JSON recipe + `key=value` overrides.

A recipe is either one RunConfig as a JSON object, or a grid of named runs sharing a base:

    {"description": "...", "base": {...RunConfig fields...}, "runs": {"preln_l4": {...overrides...}, ...}}

Overrides deep-merge into `model` (so a run only names the fields it changes). `load_recipe(path, run=...)`
picks one run; a single-run recipe needs no name. Every field says why it exists.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Ge, Gt, Interval, Le, Lt, MinLen

from ..errors import SchemaError
from ..io.files import StrictJSONError, strict_json
from ..models.config import ModelConfig
from ..schema import LAX, PATH_TEXT, OneOf, build, check_dataclass, require

SCHEDULES = ("wsd", "cosine")
RUN_FILES = ("resume", ".resume.new", ".resume.old", "log.jsonl", "snapshots")  # what <out> holds besides the export
DTYPES = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
THREADS_MAX = 1024  # torch CPU threads: beyond this the OS refuses the thread stacks (OSError), no machine has more
SEED_MAX = 2**63 - 1  # seeds feed numpy/torch generators and are stored as int64

# per-field rules, read by the schema layer (depthlens.schema.mirror)
Pos = Annotated[int, Gt(0)]
Count = Annotated[int, Ge(0)]
Seed = Annotated[int, Ge(0), Le(SEED_MAX)]
Fraction = Annotated[float, Interval(ge=0, le=1)]
Beta = Annotated[float, Ge(0), Lt(1)]

# Fields that shape the optimisation trajectory: a resume must match them exactly (micro_batch and the
# world size may differ, because the data order and the averaged gradient do not depend on them).
TRAJECTORY_FIELDS = (
    "model",
    "data",
    "tokenizer",
    "seq_len",
    "global_batch",
    "steps",
    "lr",
    "min_lr_factor",
    "warmup",
    "schedule",
    "decay_frac",
    "weight_decay",
    "decay_mixing",
    "betas",
    "eps",
    "grad_clip",
    "seed",
    "data_seed",
    "dtype",
)


@dataclass
class RunConfig:
    """One training run of a DepthModel (validated on construction)."""

    # --- what to train on -----------------------------------------------------------------------
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields: the architecture is data, not code
    data: Annotated[str, PATH_TEXT] = (
        "data/corpus-bytes"  # directory of token shards (train_*.bin / val_*.bin + manifest.json)
    )
    tokenizer: Annotated[str, PATH_TEXT] = (
        "bytes"  # tokenizer spec (get_tokenizer); must match the shards, exported with the checkpoint
    )
    seq_len: Pos = 128  # tokens per training sequence (inputs; targets are shifted by one)

    # --- batch ----------------------------------------------------------------------------------
    global_batch: Pos = 16  # sequences per optimizer step over all ranks: the unit the data order is defined in
    micro_batch: Count = 0  # sequences per forward/backward on one rank (0 = global_batch / world: no accumulation)

    # --- optimisation ---------------------------------------------------------------------------
    steps: Pos = 100  # optimizer steps; with global_batch and seq_len it fixes the token budget
    lr: Annotated[float, Gt(0)] = 3e-3  # peak learning rate: the one hyper-parameter swept per design
    min_lr_factor: Fraction = 0.1  # final LR as a fraction of the peak (torchtitan's min_lr_factor)
    warmup: Count = 10  # linear warmup steps from 0 (AdamW's second moment is unreliable early on)
    schedule: Annotated[str, OneOf(*SCHEDULES)] = "wsd"  # "wsd" (warmup-stable-decay, torchtitan) or "cosine" (nanoGPT)
    decay_frac: Fraction = 0.2  # WSD: fraction of steps in the final linear decay
    weight_decay: Annotated[float, Ge(0)] = (
        0.1  # AdamW decoupled decay, applied to >= 2-D params only (not gains, not scalars)
    )
    # Decay the residual design's own parameters (every parameter of a Router: HC static/dynamic maps, mHC
    # maps and biases, AttnRes queries, DeepNorm/KEEL/Sandwich gains) like weight matrices? Off, so every
    # design follows one recipe: decay shrinks an identity-initialised 2-D map (HC's static alpha: 0.809 I
    # after 400 steps at LR 6e-3) but not the same identity held in a 1-D bias (mHC). Zoo v2 had it on.
    decay_mixing: bool = False
    betas: Annotated[tuple[Beta, Beta], LAX] = (0.9, 0.95)  # AdamW moments (LLM-pretraining standard)
    eps: Annotated[float, Gt(0)] = 1e-8  # AdamW epsilon
    grad_clip: Annotated[float, Ge(0)] = 1.0  # global grad-norm clip (0 = off): protects early steps of deep models

    # --- reproducibility ------------------------------------------------------------------------
    seed: Seed = 0  # model init seed (identical on every rank, before wrapping)
    data_seed: Seed = 0  # data order seed: batch(step) depends only on (data_seed, step)

    # --- evaluation, logging, checkpoints -------------------------------------------------------
    eval_every: Count = 0  # validate every N steps (0 = only at the end)
    eval_batches: Count = 8  # validation batches (of global_batch sequences) per periodic eval (0 = whole val split)
    final_eval_batches: Count = 0  # validation batches for the final, recorded loss (0 = whole val split)
    log_every: Pos = 1  # write a JSONL line every N steps (the first and last step are always logged)
    save_every: Count = 0  # write the resume state every N steps (0 = only at the end)
    stop_after: Count = 0  # stop after this step as if killed, leaving the resume state (0 = run to `steps`)
    resume: bool = True  # continue from <out>/resume if it exists (a preempted job just reruns its command)
    out: Annotated[str, MinLen(1), PATH_TEXT] = "runs/default"  # run directory: log.jsonl, resume/ state
    export: Annotated[str, PATH_TEXT] = ""  # where the final depthlens checkpoint goes ("" = <out>/checkpoint)
    snapshots: list[Count] = field(
        default_factory=list
    )  # steps at which to keep a model-only analysis snapshot (0 = init)
    snapshot_every_log2: bool = False  # snapshots at step 0, 16, 32, 64, ... and the last step: depth use over training
    snapshot_eval_batches: Count = (
        4  # validation batches behind each snapshot's val_loss (cheap; the final eval is separate)
    )
    name: str = ""  # run name recorded in train.json (the recipe's run key)
    meta: dict[str, Any] = field(
        default_factory=dict
    )  # free-form notes (iso-param target, planned counts) -> train.json

    # --- hardware -------------------------------------------------------------------------------
    device: Annotated[str, OneOf(*DEVICES)] = "auto"  # "auto" (cuda if available), "cpu" or "cuda"
    dtype: Annotated[str, OneOf(*DTYPES)] = (
        "fp32"  # "fp32" or "bf16" (autocast; master weights and optimizer state stay fp32)
    )
    compile: bool = False  # torch.compile the model: ~2x on GPU, but a 10-25 s cold start on CPU
    fsdp: bool = False  # FSDP2 fully_shard (per block, then root) instead of DDP: for memory, not speed
    threads: Annotated[int, Ge(0), Le(THREADS_MAX)] = (
        0  # torch CPU threads (0 = leave torch's default); 1 avoids OpenMP stalls on shared CPUs
    )

    def __post_init__(self) -> None:
        if isinstance(self.model, ModelConfig):
            self.model = self.model.to_dict()
        check_dataclass(self)  # types and per-field ranges (the annotations above), then the cross-field rules
        try:
            model = self.model_config()
        except SchemaError as e:
            raise e.within("model") from None
        require(
            self.seq_len <= model.max_seq_len,
            "seq_len",
            f"{self.seq_len} exceeds model.max_seq_len={model.max_seq_len}",
        )
        require(
            self.micro_batch == 0 or self.global_batch % self.micro_batch == 0,
            "micro_batch",
            f"must divide global_batch={self.global_batch}, got {self.micro_batch}",
        )
        require(self.warmup <= self.steps, "warmup", f"{self.warmup} exceeds steps={self.steps}")
        require(
            all(s <= self.steps for s in self.snapshots),
            "snapshots",
            f"must be a list of steps in [0, steps={self.steps}], got {self.snapshots!r}",
        )
        out, export = Path(self.out).resolve(), self.export_dir.resolve()
        inside = out in export.parents  # fine only as a new entry of <out> (the default <out>/checkpoint)
        require(
            export != out
            and export not in out.parents
            and (not inside or (export.parent == out and export.name not in RUN_FILES)),
            "export",
            f"{self.export!r} would replace the run directory {self.out!r} or its resume state/log; "
            "export to a path of its own (or leave it empty for <out>/checkpoint)",
        )

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
            steps |= {0, self.steps} | {2**k for k in range(4, max(4, self.steps.bit_length())) if 2**k < self.steps}
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
    def from_dict(cls, d: Mapping[str, Any], where: Any = "", *, usage_fields: Any = ()) -> RunConfig:
        """From parsed JSON (a recipe's run), through the schema layer: SchemaError naming `where` and the field;
        a field in `usage_fields` (a `key=value` override) makes it a usage error."""
        return build(cls, copy.deepcopy(dict(d)) if isinstance(d, Mapping) else d, where, usage_fields=usage_fields)


# -------------------------------------------------------------------------------------------------
# recipes and overrides


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`; nested dicts (the `model` block) merge key by key."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = (
            deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else copy.deepcopy(v)
        )
    return out


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings -> a nested dict. Values parse as JSON when they can (3e-3, true, [0.9,0.95]),
    else stay strings; dotted keys reach into the model block (`model.n_layer=8`). A malformed override is a
    usage error (SchemaError, exit 2)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        path = key.split(".")
        if not sep or not all(path):
            raise SchemaError(
                f"override {item!r} is not key=value (key: a field name, dotted for model.<field>)", usage=True
            )
        try:
            value = strict_json(raw)
        except json.JSONDecodeError:
            value = raw
        except StrictJSONError as e:  # a duplicate key, a 5,000-digit integer, [NaN]: named, not read as a string
            if raw.strip() not in ("NaN", "Infinity", "-Infinity"):
                raise SchemaError(f"override {key}=...: the value {e}", usage=True) from None
            value = raw  # a string then: a number field refuses it by name, a text field keeps it
        except (RecursionError, MemoryError):
            raise SchemaError(f"override {key}=...: the value is nested too deeply", usage=True) from None
        node = out
        *parents, leaf = path
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SchemaError(f"override {item!r}: {'.'.join(path[: i + 1])} was already given a value", usage=True)
        if isinstance(node.get(leaf), dict):
            raise SchemaError(f"override {item!r}: {key} already has fields set by another override", usage=True)
        node[leaf] = value
    return out


@functools.cache
def _grid_schema() -> Any:
    """A grid recipe's container: runs share a base (each run a RunConfig field dict, validated when loaded)."""
    from pydantic import BaseModel, ConfigDict, Field

    class GridRecipe(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        description: str = ""  # what the grid is for (not a run field)
        corpus: dict[str, Any] = Field(default_factory=dict)  # how to build the data (scripts/train_zoo.sh)
        base: dict[str, Any] = Field(default_factory=dict)  # fields every run shares
        runs: dict[Annotated[str, MinLen(1)], dict[str, Any]] = Field(min_length=1)  # run name -> its overrides

    return GridRecipe


def recipe_runs(recipe: Mapping[str, Any], where: Any = "recipe") -> dict[str, dict[str, Any]]:
    """Every run of a recipe as a full RunConfig dict (base merged), keyed by run name. The container is
    validated here (SchemaError naming `where`); each run's fields when it is loaded (`RunConfig.from_dict`)."""
    from ..schema import validate

    if "runs" not in recipe:
        name = recipe.get("name", "")
        if not isinstance(name, str):
            raise SchemaError(f"expected a string, got {name!r}", field="name", where=str(where))
        return {name or "run": {k: v for k, v in recipe.items() if k != "description"}}
    grid = validate(_grid_schema(), dict(recipe), where)
    runs = {}
    for name, over in grid.runs.items():
        cfg = deep_merge(grid.base, over)
        cfg.setdefault("name", name)
        runs[name] = cfg
    return runs


def read_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """A recipe file's JSON object (through depthlens.io.files: a regular file, size-capped, one line)."""
    from ..io.files import read_json

    return read_json(path, "a recipe")


def load_recipe(
    path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = (), run: str | None = None
) -> RunConfig:
    """RunConfig from a recipe file (+ overrides). A grid recipe needs `run` (one of its run names)."""
    over = parse_overrides(overrides) if not isinstance(overrides, Mapping) else dict(overrides)
    recipe = read_recipe(path)
    runs = recipe_runs(recipe, path)
    if run is None:
        if len(runs) != 1:
            raise SchemaError(
                f"recipe has {len(runs)} runs; pick one with run=NAME ({', '.join(list(runs)[:5])}, ...)",
                where=str(path),
                usage=True,
            )
        run = next(iter(runs))
    if run not in runs:
        raise SchemaError(f"no run named {run!r}", where=str(path), usage=True)
    where = f"{path}" if "runs" not in recipe else f"{path} (run {run})"
    return RunConfig.from_dict(deep_merge(runs[run], over), where, usage_fields=over)

"""The series `track` follows, found and validated before anything is loaded: a run directory of trainer
snapshots (`scan_run`) or checkpoints given in training order (`scan_list`), each a `Series` of `Snapshot`s
with its step, tokens and validation loss. Only configs and JSON are read: mixed architectures, gaps relative to
the steps the recipe requested, steps out of order and snapshots of another run are refused here, before any
diagnostic runs (`track.py` runs them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from depthlens.errors import DepthlensError

SNAPSHOTS = "snapshots"
SNAPSHOT_JSON = "snapshot.json"
SNAPSHOT_DIR = re.compile(r"^step_(\d+)$")
STEP_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:global_)?step[_-]?0*(\d+)", re.IGNORECASE)
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
    # the property's getter on a stand-in; mypy types a property read on the class as the getter itself
    return list(RunConfig.snapshot_steps.fget(fields))  # type: ignore[attr-defined]


def _read_json(path: Path) -> dict[str, Any]:
    from depthlens.io.files import read_json

    try:
        record: dict[str, Any] = read_json(path, "a training record")
        return record
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
    """Architecture identity of one checkpoint from its config (a GGUF file is loaded to learn it; a described model,
    FILE.py:FUNCTION, is its file and function)."""
    from depthlens.adapters.userref import parse_ref

    ref = parse_ref(path)
    if ref is not None:
        return {"kind": "described", "file": str(Path(ref.file).resolve()), "function": ref.function}
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
    if sig.get("kind") == "described":
        return f"{Path(str(sig.get('file'))).name}:{sig.get('function')}"
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
    """Checkpoints given in training order (directories, GGUF files, or described models FILE.py:FUNCTION whose
    --weights name the step) → a validated Series."""
    steps: list[int | None] = []
    records: list[dict[str, Any]] = []
    for path in paths:
        p = _weights_of(path)
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
    paths: Sequence[str | os.PathLike[str]],
    *,
    recipes: Sequence[str | os.PathLike[str]] = (),
    name: str | None = None,
    tokens_per_step: float | None = None,
) -> list[Series]:
    """Every run directory is its own series; checkpoints given directly form one series, in order."""
    if not paths:
        raise _fail("give at least one run directory or checkpoint")
    from depthlens.adapters.userref import parse_ref

    runs, loose = [], []
    for p in map(Path, paths):
        if parse_ref(p) is not None:  # a described model: its weights are the snapshot
            loose.append(p)
        elif is_run_dir(p):
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


def _weights_of(path: Path) -> Path:
    """What identifies a snapshot on disk: the path itself, or a described model's weights (its file without)."""
    from depthlens.adapters.userref import parse_ref

    ref = parse_ref(path)
    if ref is None:
        return path
    return Path(ref.weights if ref.weights is not None else ref.file)


def _common_name(paths: Sequence[Path]) -> str:
    parents = {_weights_of(p).resolve().parent.name for p in paths}
    return parents.pop() if len(parents) == 1 else "series"

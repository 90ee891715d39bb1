"""What a run writes and who owns it: the run directory and the exported checkpoint are claimed (ownership
markers, depthlens.io.atomic) and locked for the whole run, so no trainer replaces a directory it did not make."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ..errors import DepthlensError, SchemaError
from .config import RunConfig
from .distributed import DistInfo, broadcast_object


def run_owner(cfg: RunConfig) -> dict[str, str]:
    """Who owns what a run writes (its marker's owner): the run directory, as an absolute path."""
    return {"run": str(Path(cfg.out).resolve())}


# overrides that leave the trained model what the recipe defines: where things go, how often to log, evaluate and
# save, how a step is split into micro-batches. Any other override (steps, data, lr, seed, model.*, ...) changes it.
NEUTRAL_OVERRIDES = frozenset(
    {
        "out",
        "export",
        "resume",
        "eval_every",
        "eval_batches",
        "log_every",
        "save_every",
        "stop_after",
        "snapshots",
        "snapshot_eval_batches",
        "micro_batch",
        "meta",
    }
)


def check_recipe_export(
    recipe: str | os.PathLike[str], overrides: Sequence[str] | Mapping[str, Any], run: str | None
) -> None:
    """Refuse (SchemaError, usage: exit 2), before any work, a recipe run whose overrides change the training but
    would still write the checkpoint to the export path the recipe names (`train zoo_cpu.json --run preln_l4 steps=3`
    replaced the shipped 400-step checkpoint with a 3-step model): such a run needs an explicit `export=`."""
    from .config import load_recipe, parse_overrides

    over = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    changed = sorted(k for k in over if k not in NEUTRAL_OVERRIDES)
    if "export" in over or not changed:
        return
    mine, recipes = load_recipe(recipe, over, run=run), load_recipe(recipe, {}, run=run)
    if not recipes.export or mine.export_dir.resolve() != recipes.export_dir.resolve():
        return  # the recipe names no export of its own (its run directory's checkpoint/), or this run writes elsewhere
    name = f" {mine.name!r}" if mine.name else ""
    raise SchemaError(
        f"the override{'s' if len(changed) > 1 else ''} {', '.join(changed)} change{'' if len(changed) > 1 else 's'} "
        f"the training of run{name}, whose checkpoint would then replace the recipe's own export "
        f"{mine.export_dir}; pass export=PATH to write it elsewhere",
        where=str(recipe),
        usage=True,
    )


def adopt_recipe_export(cfg: RunConfig) -> bool:
    """A shipped checkpoint is this run's own export when its train.json says that this very recipe run made it
    there (the same run name and the same `export` path as the recipe writes it): a clone carries no ownership
    markers (they are git-ignored), yet `depthlens train <recipe> --run NAME` must retrain the zoo checkpoint the
    recipe names. Such a checkpoint is marked as this run's; anything else is left for the refusal."""
    from ..io.atomic import legacy_kind, read_marker, write_marker
    from ..io.files import read_json

    d = cfg.export_dir
    if not cfg.name or not d.is_dir() or read_marker(d) is not None or legacy_kind(d) != "checkpoint":
        return False
    try:
        record = read_json(d / "train.json", "training record")
    except DepthlensError:
        return False
    recipe = record.get("recipe") if isinstance(record, dict) else None
    if not isinstance(recipe, dict) or record.get("name") != cfg.name or recipe.get("export") != cfg.export:
        return False
    write_marker(d, "checkpoint", run=run_owner(cfg)["run"])
    return True


@contextmanager
def owned_outputs(cfg: RunConfig, dist: DistInfo) -> Iterator[None]:
    """Before any work, rank 0 checks that the run directory is new, empty or a depthlens run directory (its
    marker), and that the export is new, empty or this run's own export (a user's directory or a checkpoint
    made elsewhere is never replaced); then it holds both for the whole run (one trainer per run directory
    and per export: a second refuses naming the first). Every rank raises the same one-line refusal."""
    from ..io.atomic import check_target, claim_dir, output_lock

    owner = run_owner(cfg)
    error: Exception | None = None
    with ExitStack() as held:
        if dist.is_main:
            try:
                adopt_recipe_export(cfg)
                claim_dir(cfg.out, "run", create=False)  # created (and marked) by run(), after the setup
                check_target(cfg.export_dir, False, kinds=("checkpoint",), flag="", owner=owner, make_parents=True)
                held.enter_context(output_lock(cfg.out, "run directory"))
                if cfg.export_dir.resolve().parent != Path(cfg.out).resolve():  # else the run directory's lock holds it
                    held.enter_context(output_lock(cfg.export_dir, "export"))
            except DepthlensError as e:
                error = e
        message = broadcast_object(None if error is None else str(error), dist)
        if error is not None:
            raise error
        if message is not None:
            raise DepthlensError(message)
        yield

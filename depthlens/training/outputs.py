"""What a run writes and who owns it: the run directory and the exported checkpoint are claimed (ownership
markers, depthlens.io.atomic) and locked for the whole run, so no trainer replaces a directory it did not make."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ..errors import DepthlensError
from .config import RunConfig
from .distributed import DistInfo, broadcast_object


def run_owner(cfg: RunConfig) -> dict[str, str]:
    """Who owns what a run writes (its marker's owner): the run directory, as an absolute path."""
    return {"run": str(Path(cfg.out).resolve())}


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
    write_marker(d, "checkpoint", **run_owner(cfg))
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

"""Where and how a report is written (steps 1 and 6 of `report.build`).

`check_out` refuses an existing output directory (unless overwrite, and then only a report's), a file or an
unwritable location, before any work is done. `write_report` writes figures, datasets, summary.json,
manifest.json, index.html and README.md into a hidden temporary directory next to `out`, renamed into place at
the end (the old report, with overwrite, is swapped out and removed only then); every file inside is written
atomically too. On any failure nothing is left behind.

Merged netCDF files: the per-checkpoint Datasets of one metric are concatenated along `checkpoint` only within
groups of identical dimensions and index coordinates (in practice: the same depth L; AttnRes also splits by
design, since Full and Block AttnRes have different sources). One group → `<metric>.nc`; several →
`<metric>_l<L>.nc` (plus `_<design>` when one depth holds several shapes). `manifest.json` lists which
checkpoints each file holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from depthlens.diagnostics import registry
from depthlens.errors import DepthlensError
from depthlens.io.atomic import atomic_dir, atomic_write_text, recover
from depthlens.io.jsonsafe import jsonable

# report.build's Report and study's Entry, named for the signatures; not imported (report imports this module)
Entry: TypeAlias = Any
Report: TypeAlias = Any

Progress = Callable[[str], None]  # called once per finished step with a short description


def _noop(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------------------------
# output location


def check_out(out: str | os.PathLike, overwrite: bool, held: contextlib.ExitStack | None = None) -> Path:
    """Fail early (DepthlensError, one line) if `out` exists without overwrite, is a file or a directory that is
    not a depthlens report (no ownership marker: never replaced, so `--out checkpoints --overwrite` cannot wipe
    anything), is being written by another depthlens, or can't be created. Given `held`, the output's lock is
    taken and kept there (one writer per report directory)."""
    from depthlens.io.atomic import MARKER, check_target, output_lock, recognise

    out = Path(out)
    recover(out)  # an interrupted swap of an earlier run: keep the newest complete report
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise DepthlensError(f"{out} exists and is not a directory")
        if any(out.iterdir()) and recognise(out) != "report":
            raise DepthlensError(
                f"{out} exists and is not a depthlens report (no {MARKER} marker of one); "
                "refusing to replace it, even with --overwrite"
            )
    check_target(out, overwrite, kinds=("report",), make_parents=True)  # --overwrite, name length, writable
    if held is not None:
        held.enter_context(output_lock(out, "report"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# writing


def _group_key(ds) -> tuple:
    idx = tuple((k, tuple(str(v) for v in ds.indexes[k])) for k in sorted(ds.indexes))
    return (tuple(sorted(ds.sizes.items())), idx)


def merged_datasets(entries: Sequence[Entry], metric: str) -> list[tuple[str, list[str], Any]]:
    """[(file name, checkpoint names, Dataset)]: concatenated along `checkpoint` within equal-shape groups."""
    from depthlens.io.dataset import concat_checkpoints

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
    from depthlens.io.dataset import depthlens_version

    d = rep.data
    return jsonable(
        {
            "title": "depthlens report",
            "depthlens_version": depthlens_version(),
            "command": rep.command,
            "world_size": rep.world_size,
            "results_cache": rep.cache_line,
            "options": rep.options.as_dict(),
            "eval_data": {
                "name": d.name,
                "source": d.source,
                "sha256": d.sha256,
                "n_seq": d.n_seq,
                "seq_len": d.seq_len,
                "n_tokens": d.n_tokens,
                "seed": d.seed,
                "tokenizer": d.tokenizer,
            },
            "checkpoints": [
                {
                    "checkpoint": e.name,
                    "path": str(e.path),
                    "design": e.slug,
                    "n_layer": e.n_layer,
                    "figures": e.figures,
                    "notes": e.notes,
                }
                for e in rep.entries
            ],
            "datasets": rep.files,
            "figures": rep.figures,
            "robustness": rep.robustness,
            "comparisons": rep.comparisons,
            "notes": rep.notes,
            "merge_rule": "per metric, checkpoints with identical dims and index coordinates are concatenated along "
            "`checkpoint` (one file per group; <metric>.nc when there is one group, else "
            "<metric>_l<L>[_<design>].nc)",
        }
    )


# Per-checkpoint figures are drawn by forked worker processes (one per core, at most FIGURE_WORKERS) while this
# process draws the cross-checkpoint ones: matplotlib is single-threaded, and in the main job the other core is
# otherwise idle by then. The children only read the entries (inherited at the fork) and draw: the same code, so
# the same bytes (tests/test_figures_repro.py).
#
# Why concurrent.futures and not multiprocessing.Pool: a Pool's `with` ends in terminate(), which SIGTERMs its
# workers and then waits for them without a limit; in a pytest-xdist worker one SIGTERM was lost and the suite
# hung (CI, 2026-12). The executor ends its workers with a sentinel, an ordinary exit, and a worker that dies
# raises BrokenProcessPool instead of leaving the parent waiting for a result that never comes.
FIGURE_WORKERS = 2
_FIGURE_JOB: tuple[Sequence[Entry], Path] | None = None  # what the forked workers draw from


def _figure_worker_start() -> None:
    """Worker initializer: the signal handlers inherited from the parent (the temp cleanup of `io.temps`, a
    caller's own) are the parent's business; a worker dies of SIGTERM/SIGHUP and leaves Ctrl-C to the parent."""
    import signal

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _draw_checkpoint(i: int) -> tuple[dict[str, str], list[str]]:
    """Worker: the figures of entry i, and the notes drawing added to it (the parent's copy gets them)."""
    assert _FIGURE_JOB is not None
    entries, fig_dir = _FIGURE_JOB
    return _draw_one(entries[i], fig_dir)


@contextlib.contextmanager
def _figure_workers(entries: Sequence[Entry], fig_dir: Path) -> Iterator[Iterator[tuple[dict[str, str], list[str]]]]:
    """Yields an iterator of (figures, new notes) per entry, in order: from a pool of forked workers when there
    are spare cores and fork is available, else drawn in this process."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    global _FIGURE_JOB
    n = min(FIGURE_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, len(entries))
    if n < 2 or "fork" not in mp.get_all_start_methods():
        yield (_draw_one(e, fig_dir) for e in entries)
        return
    _FIGURE_JOB = (entries, fig_dir)
    pool = ProcessPoolExecutor(n, mp_context=mp.get_context("fork"), initializer=_figure_worker_start)
    try:
        yield pool.map(_draw_checkpoint, range(len(entries)))
    except BrokenProcessPool as e:
        raise DepthlensError(f"a figure worker died ({e}); nothing was written") from e
    finally:
        # every result was taken on success; on an error the drawing ones finish (a second each), queued ones never
        # start
        pool.shutdown(wait=True, cancel_futures=True)
        _FIGURE_JOB = None


def _draw_one(e: Entry, fig_dir: Path) -> tuple[dict[str, str], list[str]]:
    """The figures of one entry and the notes drawing added, taken off the entry (the caller adds them back)."""
    from ..render import figures

    before = len(e.notes)
    figs = figures.checkpoint_figures(e, fig_dir)
    new = list(e.notes[before:])
    del e.notes[before:]
    return figs, new


def write_report(rep: Report, out: str | os.PathLike, overwrite: bool = False, progress: Progress = _noop) -> Path:
    """Write figures, datasets, summary.json, manifest.json, index.html and README.md into `out`, atomically."""
    from depthlens.io.dataset import write_netcdf

    from ..render import figures
    from ..render import pages as render
    from .reproducible import reproducible, timings

    out = check_out(out, overwrite)
    try:
        # built under a temp name, swapped in whole; on failure or SIGTERM nothing is left (depthlens.io.atomic)
        with atomic_dir(out, overwrite=overwrite, checked=True, kind="report") as tmp:
            (tmp / "figures").mkdir()
            t0 = time.perf_counter()
            with _figure_workers(rep.entries, tmp / "figures") as pending:
                rep.figures = figures.cross_figures(rep, tmp / "figures")  # while the workers draw the rest
                progress("cross-checkpoint figures")
                for e, (figs, notes) in zip(rep.entries, pending):
                    e.figures = figs
                    e.notes.extend(notes)
                    progress(f"{e.name}: figures")
            rep.seconds["figures"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            for metric in registry.names():
                for fname, names, ds in merged_datasets(rep.entries, metric):
                    write_netcdf(reproducible(ds), tmp / fname)
                    rep.files[fname] = names
            for metric, sw in rep.sweeps.items():
                score = registry.get(metric).headline
                assert score is not None, metric  # a sweep is made only for a metric with a headline score
                fname = f"sweep_{score.key}.nc"
                write_netcdf(reproducible(sw), tmp / fname)
                rep.files[fname] = [str(n) for n in sw["checkpoint"].values]
            rep.seconds["datasets"] = round(time.perf_counter() - t0, 2)
            atomic_write_text(tmp / "summary.json", json.dumps(rep.records, indent=1) + "\n")
            atomic_write_text(tmp / "manifest.json", json.dumps(manifest(rep), indent=1) + "\n")
            atomic_write_text(tmp / "timings.json", json.dumps(timings(rep), indent=1) + "\n")
            atomic_write_text(tmp / "index.html", render.render_html(rep))
            atomic_write_text(tmp / "README.md", render.render_markdown(rep))
        progress("write")
    except OSError as e:
        raise DepthlensError(f"cannot write {out}: {e.strerror or e}") from e
    return out

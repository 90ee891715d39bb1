"""What keeps a report reproducible: run-to-run facts (when, how long, on which machine) go to `timings.json`,
which git ignores; the tracked files (netCDF datasets, figures, tables) carry none, so rerunning an unchanged
report leaves them byte-identical (`scripts/zoo-report.sh` on a clean clone leaves `git status` clean)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from depthlens.io.jsonsafe import jsonable

if TYPE_CHECKING:
    import xarray as xr

# per-run dataset attrs/coords kept out of the report's tracked netCDF files: when it was made, and how long an engine
# took and whether its tuned-lens translators came from the cache (a report's costs are in its untracked timings.json)
REPRO_DROPPED = ("created", "eval_seconds", "eval_cpu_seconds", "train_seconds", "train_cpu_seconds", "cache")


def timings(rep: Any) -> dict[str, Any]:
    """The contents of `timings.json`: creation time, compute seconds (whole report and per checkpoint and
    metric), the machine, and the `created` stamps the datasets carried."""
    import platform

    out: dict[str, Any] = jsonable(
        {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": rep.seconds,
            "checkpoints": {e.name: e.seconds for e in rep.entries},
            "machine": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "torch_threads": rep.options.threads,
            },
            "datasets_created": {
                e.name: sorted({str(ds.attrs["created"]) for ds in e.datasets.values() if "created" in ds.attrs})
                for e in rep.entries
            },
        }
    )
    return out


def _history_command(h: Any) -> str:
    """`history` without its leading ISO time ("2026-12-01T16:20:55+00:00 depthlens report ..." → the command)."""
    first, _, rest = str(h).partition(" ")
    return rest if first[:4].isdigit() and "T" in first else str(h)


def _map_coord(ds: xr.Dataset, name: str, fn: Callable[[Any], str]) -> xr.Dataset:
    values = np.array([fn(v) for v in np.atleast_1d(ds[name].values)], dtype=object).reshape(ds[name].shape)
    return ds.assign_coords({name: (ds[name].dims, values)})


def reproducible(ds: xr.Dataset) -> xr.Dataset:
    """`ds` without its run-time stamps: `created` dropped, the ISO time in front of `history` removed
    (the command stays), `checkpoint_path` relative to the working directory when it lies below it (as the
    summary's `path`), so the same inputs give byte-identical netCDF files in any clone."""
    ds = ds.drop_vars([k for k in REPRO_DROPPED if k in ds.coords])
    for k in REPRO_DROPPED:
        ds.attrs.pop(k, None)
    here = Path.cwd()

    def local(p: Any) -> str:
        try:
            return str(Path(str(p)).relative_to(here))
        except ValueError:  # elsewhere: the absolute path is the only honest one
            return str(p)

    if "checkpoint_path" in ds.attrs:
        ds.attrs["checkpoint_path"] = local(ds.attrs["checkpoint_path"])
    if "checkpoint_path" in ds.coords:
        ds = _map_coord(ds, "checkpoint_path", local)
    if "history" in ds.attrs:
        ds.attrs["history"] = _history_command(ds.attrs["history"])
    if "history" in ds.coords:
        hist = {_history_command(h) for h in np.atleast_1d(ds["history"].values)}
        if len(hist) == 1:  # identical once the times are gone: one attribute, as for a single checkpoint
            ds = ds.drop_vars("history")
            ds.attrs["history"] = hist.pop()
        else:
            ds = _map_coord(ds, "history", _history_command)
    return ds

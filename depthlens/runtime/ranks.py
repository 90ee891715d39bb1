"""Checkpoints over torchrun ranks for `report` (build.compute_spread): estimated cost, assignment, transport.

    torchrun --nproc_per_node 4 -m depthlens.cli report checkpoints/*/ --out reports/all

Every rank computes whole checkpoints of its own; rank 0 gathers their records and datasets and writes the
one report. A Dataset travels as `to_dict(data="array", encoding=True)` (numpy arrays and plain attrs):
exact, where a netCDF round trip would turn int/float attributes into numpy scalars.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import DepthlensError
from ..io.files import read_json


def cost(path: str | os.PathLike[str]) -> float:
    """Estimated compute of one checkpoint's report: n_layer² × weight bytes (a causal sweep skips each of L
    layers and re-runs up to L layers; a forward costs ∝ parameters). Read from config.json and file sizes
    only; a checkpoint that can't be read costs 0 (the rank it lands on reports the real error)."""
    p = Path(path)
    try:
        weights = [p] if p.is_file() else [*p.glob("*.safetensors"), *p.glob("*.gguf")]
        size = sum(f.stat().st_size for f in weights)
        raw: dict[str, Any] = (
            read_json(p / "config.json", "model config") if p.is_dir() else {}
        )  # a FIFO would hang the rank
        nested = raw.get("model")
        cfg = nested if isinstance(nested, dict) else raw  # depthlens nests it under "model"
        n_layer = int(cfg.get("n_layer") or cfg.get("num_hidden_layers") or 1)
    except (OSError, ValueError, TypeError, AttributeError, DepthlensError):
        return 0.0
    return float(n_layer) ** 2 * size


def assign(paths: Sequence[str | os.PathLike[str]], n: int) -> list[int]:
    """The rank of every checkpoint (greedy longest-processing-time: largest cost first, each to the
    least-loaded rank; ties by position and by lowest rank, so rank 0 always has work)."""
    costs = [cost(p) for p in paths]
    load = [0.0] * n
    owner = [0] * len(paths)
    for i in sorted(range(len(paths)), key=lambda i: (-costs[i], i)):
        r = min(range(n), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner


def pack(entry: Any) -> dict[str, Any]:
    """A computed report Entry as plain data for the trip to rank 0 (its model stays on its rank)."""
    d = {f.name: getattr(entry, f.name) for f in fields(entry) if f.name not in ("model", "datasets", "untrained")}
    for name in ("datasets", "untrained"):
        d[name] = {m: ds.to_dict(data="array", encoding=True) for m, ds in getattr(entry, name).items()}
    return d


def unpack(d: dict[str, Any]) -> dict[str, Any]:
    """`pack`'s output back as Entry keyword arguments (model None)."""
    import xarray as xr

    return {
        **d,
        "model": None,
        **{
            name: {m: xr.Dataset.from_dict(ds) for m, ds in d.get(name, {}).items()}
            for name in ("datasets", "untrained")
        },
    }


def attempt(fn: Callable[[], Any]) -> tuple[BaseException | None, Any]:
    """(None, fn()) or (its exception, None): one rank-local step whose failure goes to `distributed.agree`
    instead of leaving the other ranks waiting in the next collective."""
    try:
        return None, fn()
    except Exception as err:  # noqa: BLE001  (every rank must reach the agree, whatever went wrong)
        return err, None

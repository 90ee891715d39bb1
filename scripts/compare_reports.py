"""Whether two report directories hold the same results: every summary.json value and every netCDF variable,
coordinate and attribute, bit for bit, apart from what names the run rather than the result (paths, history,
creation times, git SHA, versions, timings).

    python scripts/compare_reports.py OLD NEW      # exit 0: the same; 1: lists each difference

Use it around a move of code that must not change results: run the same report at the commit before the move and
at the working tree (same options, same eval data), then compare the two directories.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

# what says where and when a run happened, not what it found
RUN_FIELDS = {
    "path",
    "checkpoint_path",
    "model_path",  # the absolute path of the checkpoint read: where the checkout sits
    "history",
    "created",
    "command",
    "git_sha",
    "depthlens_version",
    "out",
    "seconds",
    "wall_seconds",
    "timings",
}


def _json_diffs(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}: key {k!r} only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            if k not in RUN_FIELDS:
                out += _json_diffs(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _json_diffs(x, y, f"{where}[{i}]")]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b))
    return [] if same else [f"{where}: {a!r} vs {b!r}"]


def _array_same(x: xr.Variable, y: xr.Variable) -> bool:
    if x.dims != y.dims or x.shape != y.shape:
        return False
    if x.dtype.kind in "fc":
        return bool(np.array_equal(x.values, y.values, equal_nan=True))
    return bool(np.array_equal(x.values, y.values))


def _attr_diffs(a: dict[str, Any], b: dict[str, Any], where: str) -> list[str]:
    keys = (set(a) | set(b)) - RUN_FIELDS
    return [f"{where}: attr {k!r} differs" for k in sorted(keys) if str(a.get(k)) != str(b.get(k))]


def dataset_diffs(a: xr.Dataset, b: xr.Dataset, name: str) -> list[str]:
    out = [f"{name}: variable {v!r} only in one" for v in sorted(set(a.variables) ^ set(b.variables), key=str)]
    for v in sorted(set(a.variables) & set(b.variables), key=str):
        if v in RUN_FIELDS:
            continue
        if not _array_same(a.variables[v], b.variables[v]):
            out.append(f"{name}: {v!r} differs")
        out += _attr_diffs(dict(a.variables[v].attrs), dict(b.variables[v].attrs), f"{name}:{v}")
    return out + _attr_diffs(dict(a.attrs), dict(b.attrs), name)


def report_diffs(old: Path, new: Path) -> list[str]:
    """Every difference in results between report directories `old` and `new` ([] = the same)."""
    out = _json_diffs(
        json.loads((old / "summary.json").read_text(encoding="utf-8")),
        json.loads((new / "summary.json").read_text(encoding="utf-8")),
        "summary.json",
    )
    names = {p.name for p in old.glob("*.nc")} | {p.name for p in new.glob("*.nc")}
    for name in sorted(names):
        if not (old / name).is_file() or not (new / name).is_file():
            out.append(f"{name}: only in one")
            continue
        with xr.open_dataset(old / name) as a, xr.open_dataset(new / name) as b:
            out += dataset_diffs(a.load(), b.load(), name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    a = ap.parse_args(argv)
    diffs = report_diffs(a.old, a.new)
    n = len(list(a.old.glob("*.nc")))
    print("\n".join(diffs) if diffs else f"the same: summary.json and {n} datasets")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

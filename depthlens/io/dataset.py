"""xarray Dataset conventions, provenance and atomic netCDF I/O (docs/concepts.md#results).

Conventions:

- One Dataset per analysis run. Every data variable carries CF `long_name` and `units` ("1" when
  dimensionless); `make_dataset` refuses variables without them.
- Square layer × layer matrices use the dims `LAYER_DIMS = ("layer", "layer_other")`: row `layer` is the
  earlier (skipped / first-swapped) layer, column `layer_other` the later one. Two different names are needed
  because xarray does not support duplicate dimension names. The angular-distance offset dim is `block_size`.
  What a layer index means differs by metric, so `make_dataset` gives those coordinates a `long_name` from
  `COORD_LONG_NAMES` (plots label their axes with it); the dim names stay as they are.
- Global attrs: `title`, `Conventions="CF-1.11"`, `source="depthlens <version>"`, `history="<ISO time> <command>"`,
  `metric`, then every option and provenance value. netCDF only stores str/number attrs, so dict/list → JSON
  string under `<key>_json`, None → omitted (`netcdf_attrs`); booleans stay booleans in memory and are 0/1 in the
  file, listed in `bool_attrs_json`, and `read_netcdf` gives them back as booleans.
- Every dimension has a coordinate and every coordinate a `long_name` (`label_coords`). Cells that are no
  measurement are NaN, never 0 (C(s, t) for t < s); `read_netcdf` upgrades files written before that (`upgrade`).
- Comparisons stack runs along a `checkpoint` dim (`concat_checkpoints`); attrs that differ between runs
  become per-checkpoint coordinates.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Hashable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from depthlens._version import __version__
from depthlens.data.shards import sha256_file  # the one streamed file hash
from depthlens.errors import CheckpointError, DepthlensError
from depthlens.io.provenance import command_line

LAYER_DIMS = ("layer", "layer_other")
EVAL_TOKEN_DIMS = ("eval_seq", "eval_pos")  # the `eval_tokens` variable every result stores (int32 ids)
CHECKPOINT_FILES = ("model.safetensors", "config.json")
_REQUIRED_VAR_ATTRS = ("long_name", "units")
# coordinate → long_name, set on coordinates that have none; an engine adds its own (make_dataset(coord_names=...))
COORD_LONG_NAMES: Mapping[str, str] = {
    "layer": "layer",
    "layer_other": "later layer",
    "sublayer": "sublayer j (2l = attention, 2l+1 = MLP)",
    "variant": "causal-score variant (current: skip s where t reads it; future: skip s before a cut, measure after)",
    "aggregator": "aggregation over tokens (max | mean | p95 | p99 | pooled = sqrt(sum|du|^2 / sum|u|^2))",
    "sequence": "eval sequence",
    "eval_seq": "eval sequence",
    "eval_pos": "token position in the eval sequence (0 = BOS)",
    "checkpoint": "checkpoint",
    "window_start": "late-window start rule",
    "threshold": "threshold theta",
}
BOOL_ATTRS = "bool_attrs_json"  # the attrs that are booleans (netCDF stores them as 0/1; read_netcdf restores them)
_CHUNK = 1 << 20  # 1 MiB streaming reads for hashing


def depthlens_version() -> str:
    """The installed package version (`depthlens._version`, which imports nothing of depthlens)."""
    return __version__


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------------------
# attributes


def _attr_item(key: str, value: Any) -> tuple[str, Any] | None:
    """One attr converted to a netCDF-storable (key, value), or None to omit it."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):  # before int: bool is an int subclass but netCDF rejects it
        return key, int(value)
    if isinstance(value, np.generic):
        return _attr_item(key, value.item())
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (dict, list, tuple)):
        json_key = key if key.endswith("_json") else f"{key}_json"
        return json_key, json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, os.PathLike):
        return key, os.fspath(value)
    if isinstance(value, (str, int, float)):
        return key, value
    raise TypeError(f"attribute {key!r}: cannot store {type(value).__name__} in netCDF; convert it to str first")


def netcdf_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Convert attrs to types netCDF accepts: bool → 0/1, dict/list → JSON under `<key>_json`, None dropped."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        item = _attr_item(str(key), value)
        if item is None:
            continue
        if item[0] in out:
            raise ValueError(f"attribute {item[0]!r} produced twice (from {key!r})")
        out[item[0]] = item[1]
    return out


def make_dataset(
    data_vars: Mapping[str, Any],
    coords: Mapping[str, Any] | None = None,
    *,
    metric: str,
    options: Mapping[str, Any],
    provenance: Mapping[str, Any],
    title: str | None = None,
    command: str | None = None,
    coord_names: Mapping[str, str] | None = None,
) -> xr.Dataset:
    """Build a labelled result Dataset with CF global attrs, options and provenance as attrs.

    data_vars/coords: as for `xr.Dataset` (e.g. name → `data_var(dims, values, long_name, units)`).
    provenance["eval_tokens"] (an (N, T) id array, set by `evaldata.model_provenance`) becomes the
    `eval_tokens` variable (dims `EVAL_TOKEN_DIMS`); `EvalData.from_dataset` reads it back.
    Every data variable must have `long_name` and `units` attrs (ValueError otherwise).
    command: recorded in `history`; defaults to the current command line.
    coord_names: the engine's own coordinate long names (e.g. causal's "skipped layer s"), over COORD_LONG_NAMES.
    """
    provenance = dict(provenance)
    tokens = provenance.pop("eval_tokens", None)
    if tokens is not None:  # the exact eval ids, so anyone can re-run an independent check on them
        data_vars = {
            **data_vars,
            "eval_tokens": data_var(
                EVAL_TOKEN_DIMS, np.asarray(tokens).astype(np.int32), "eval token ids (sequence x position)"
            ),
        }
    ds = xr.Dataset(data_vars, coords)
    for name, var in ds.variables.items():
        if name in ds.data_vars:
            missing = [a for a in _REQUIRED_VAR_ATTRS if a not in var.attrs]
            if missing:
                raise ValueError(f"data variable {name!r} lacks attrs {missing} (CF: long_name, units='1' if none)")
        var.attrs = netcdf_attrs(var.attrs)
    label_coords(ds, coord_names)
    command = command if command is not None else command_line()
    attrs: dict[str, Any] = {
        "title": title or f"depthlens {metric}",
        "Conventions": "CF-1.11",
        "source": f"depthlens {depthlens_version()}",
        "history": f"{_now_iso()} {command}".rstrip(),
        "metric": metric,
    }
    for group_name, group in (("options", options), ("provenance", provenance)):
        for key, value in netcdf_attrs(group).items():
            if key in attrs:
                raise ValueError(f"{group_name} key {key!r} clashes with an attribute already set")
            attrs[key] = value
            if isinstance(group.get(key), (bool, np.bool_)):
                attrs[key] = bool(group[key])  # a real boolean in memory; 0/1 in the file, restored on read
    ds.attrs = attrs
    return ds


def data_var(
    dims: tuple[Hashable, ...], values: Any, long_name: str, units: str = "1", **attrs: Any
) -> tuple[tuple[Hashable, ...], Any, dict[str, Any]]:
    """A data variable as `make_dataset` takes it: (dims, values, attrs with its long name and units)."""
    return dims, values, {"long_name": long_name, "units": units, **attrs}


def scalar_var(v: Any, long_name: str, units: str = "1") -> xr.DataArray:
    """A 0-d float64 variable (NaN for None) with its long name and units: one `track` snapshot's number."""
    return xr.DataArray(np.float64(np.nan if v is None else v), attrs={"long_name": long_name, "units": units})


def kept_var(da: xr.DataArray, long_name: str, units: str = "1") -> xr.DataArray:
    """`da` without its non-dimension coords (a `.sel` leaves them), relabelled: one `track` snapshot's array."""
    da = da.drop_vars([c for c in da.coords if c not in da.dims])
    return da.assign_attrs(long_name=long_name, units=units)


def label_coords(ds: xr.Dataset, own: Mapping[str, str] | None = None) -> xr.Dataset:
    """In place: a coordinate on every dimension (0..n-1 where the engine gave none) and a `long_name` on every
    coordinate (`own`, else `COORD_LONG_NAMES`, else the name in words). Index coordinates carry no units (plots
    label axes with long_name [units])."""
    for dim in ds.dims:
        if dim not in ds.coords:
            ds.coords[dim] = np.arange(ds.sizes[dim])
    names = {**COORD_LONG_NAMES, **(own or {})}
    for name in ds.coords:
        attrs = ds[name].attrs
        if "long_name" not in attrs:
            attrs["long_name"] = names.get(str(name), str(name).replace("_", " "))
    return ds


def _for_netcdf(ds: xr.Dataset) -> xr.Dataset:
    """A shallow copy whose attrs netCDF can store: booleans as 0/1, named in `BOOL_ATTRS` so they come back."""
    out = ds.copy(deep=False)
    bools = sorted(k for k, v in ds.attrs.items() if isinstance(v, (bool, np.bool_)))
    out.attrs = netcdf_attrs(ds.attrs)
    if bools:
        out.attrs[BOOL_ATTRS] = json.dumps(bools)
    for name in out.variables:
        out[name].attrs = netcdf_attrs(ds[name].attrs)
    return out


def upgrade(ds: xr.Dataset, where: str = "dataset") -> xr.Dataset:
    """A dataset as read, made what this version writes (in place; returned): its boolean attrs real booleans,
    and for a causal dataset of a depthlens before NaN cells, the cells of C(s, t) that are no measurement (t < s)
    as NaN instead of 0, in `causal_score`, `direct_score` and the per-sequence `seq_*` variables."""
    from depthlens.io.files import loads_json

    names = ds.attrs.pop(BOOL_ATTRS, None)
    keys = [] if names is None else loads_json(str(names), where, f"attribute {BOOL_ATTRS!r}")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise DepthlensError(f"{where}: attribute {BOOL_ATTRS!r} must be a JSON list of attribute names")
    for k in keys:
        if k in ds.attrs:
            ds.attrs[k] = bool(ds.attrs[k])
    if "causal_score" not in ds or not set(LAYER_DIMS) <= set(ds["causal_score"].dims):
        return ds
    below = ds[LAYER_DIMS[1]] < ds[LAYER_DIMS[0]]
    for name in ("causal_score", "direct_score", "seq_max", "seq_sum", "seq_sq_change"):
        if name in ds:
            da = ds[name]
            old = below & (da == 0)  # what the old writer filled in below the diagonal
            if bool(old.any()):
                ds[name] = da.where(~old)
                ds[name].attrs = da.attrs
    return ds


# ---------------------------------------------------------------------------------------------------------------
# provenance


def _hash_file_into(h, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def checkpoint_sha256(checkpoint_dir: str | os.PathLike, files: Sequence[str] = CHECKPOINT_FILES) -> str:
    """Hex SHA-256 identifying a checkpoint: weights and config, streamed in a fixed order.

    Each file contributes its name and byte size before its bytes, so the digest is unambiguous; it is
    therefore not the `sha256sum` of any single file. Missing files raise CheckpointError.
    """
    root = Path(checkpoint_dir)
    h = hashlib.sha256()
    for name in files:
        path = root / name
        if not path.is_file():
            raise CheckpointError(f"{root}: missing {name}")
        h.update(f"{name}\0{path.stat().st_size}\0".encode())
        _hash_file_into(h, path)
    return h.hexdigest()


def data_sha256(data) -> str:
    """Hex SHA-256 of eval data: a file path, bytes, or an array/tensor (dtype and shape are hashed too)."""
    if isinstance(data, (str, os.PathLike)):
        return sha256_file(data)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return hashlib.sha256(data).hexdigest()
    if hasattr(data, "detach"):  # torch tensor; viewed as raw bytes so bf16 works too
        t = data.detach().cpu().contiguous()
        header, raw = f"{t.dtype}{tuple(t.shape)}", t.reshape(-1).view(dtype=_torch_uint8()).numpy().tobytes()
    else:
        a = np.ascontiguousarray(data)
        header, raw = f"{a.dtype.str}{a.shape}", a.tobytes()
    h = hashlib.sha256(header.encode())
    h.update(raw)
    return h.hexdigest()


def _torch_uint8():
    import torch

    return torch.uint8


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def provenance(
    checkpoint_dir: str | os.PathLike | None = None,
    *,
    design: str | None = None,
    config: Mapping[str, Any] | None = None,
    eval_data=None,
    n_tokens: int | None = None,
    seed: int | None = None,
    dtype=None,
    **extra: Any,
) -> dict[str, Any]:
    """Provenance record for a result: checkpoint path + SHA-256, config, design, eval-data hash, sizes, versions.

    config defaults to the checkpoint's config.json. eval_data: a file path, bytes or token array (hashed).
    Values may be dicts/None; `make_dataset` converts them (config → `config_json`, None omitted).
    """
    record: dict[str, Any] = {}
    if checkpoint_dir is not None:
        root = Path(checkpoint_dir)
        record["checkpoint_path"] = str(root.resolve())
        record["checkpoint_sha256"] = checkpoint_sha256(root)
        if config is None:
            from depthlens.io.files import read_json

            config = read_json(root / "config.json", "model config", error=CheckpointError)
    record.update(
        design=design,
        config=dict(config) if config is not None else None,
        eval_data_sha256=data_sha256(eval_data) if eval_data is not None else None,
        n_tokens=int(n_tokens) if n_tokens is not None else None,
        seed=seed,
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
        depthlens_version=depthlens_version(),
        torch_version=_torch_version(),
        created=_now_iso(),
    )
    record.update(extra)
    return record


# ---------------------------------------------------------------------------------------------------------------
# netCDF I/O


def write_netcdf(ds: xr.Dataset, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write `ds` to netCDF4 atomically: a temp file in the same directory, then `os.replace`.

    Raises DepthlensError (one-line message) if `path` exists and not overwrite, or the directory is
    missing/unwritable. On any failure no file (partial or temp) is left behind. Returns the path.
    """
    from depthlens.io.atomic import atomic_target, check_target

    path = Path(path)
    if path.is_dir():
        raise DepthlensError(f"{path} is a directory, not a file path")
    check_target(path, overwrite, kinds=("netCDF dataset",))  # replaces only a depthlens netCDF file
    parent = path.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DepthlensError(f"cannot write {path}: directory {parent} is not writable")
    with atomic_target(path) as tmp:  # created by netCDF itself, so it gets normal permissions
        _for_netcdf(ds).to_netcdf(tmp, engine="netcdf4")
    return path


def read_netcdf(path: str | os.PathLike) -> xr.Dataset:
    """Load a netCDF file fully into memory and close it. Missing/unreadable files raise DepthlensError."""
    path = Path(path)
    if not path.is_file():
        raise DepthlensError(f"{path}: no such file")
    try:
        ds = xr.load_dataset(path, engine="netcdf4")
    except OSError as e:
        raise DepthlensError(f"{path}: not a readable netCDF file ({e})") from e
    return upgrade(ds, str(path))


# ---------------------------------------------------------------------------------------------------------------
# comparisons


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return type(a) is type(b) and a == b


def _attr_column(values: list[Any]) -> np.ndarray:
    """Per-checkpoint attr values as one array: float with NaN for missing numbers, else str with ""."""
    present = [v for v in values if v is not None]
    numeric = all(isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)) for v in present)
    if numeric:
        return np.array([np.nan if v is None else float(v) for v in values])
    return np.array(["" if v is None else str(v) for v in values])


def concat_checkpoints(datasets: Sequence[xr.Dataset], names: Sequence[str], dim: str = "checkpoint") -> xr.Dataset:
    """Stack per-checkpoint Datasets along a new `dim` labelled by `names`.

    Global attrs equal across all inputs stay global; attrs that differ (or are missing somewhere), such as
    `checkpoint_sha256`, `seed` or `history`, become coordinates along `dim` (prefixed `attr_` if the name is
    taken). Layer coordinates are outer-joined, so different L give NaN padding.
    """
    if not datasets or len(datasets) != len(names):
        raise ValueError(f"need one name per dataset, got {len(datasets)} datasets and {len(names)} names")
    if len(set(names)) != len(names):
        raise ValueError(f"checkpoint names must be unique, got {list(names)}")
    keys = list(dict.fromkeys(k for ds in datasets for k in ds.attrs))
    first = datasets[0].attrs
    differing = [
        k for k in keys if not all(k in ds.attrs and k in first and _same(ds.attrs[k], first[k]) for ds in datasets)
    ]
    taken = {dim} | {str(v) for ds in datasets for v in ds.variables}
    per_checkpoint = {
        (f"attr_{k}" if k in taken else k): (dim, _attr_column([ds.attrs.get(k) for ds in datasets])) for k in differing
    }
    labelled = [ds.assign_coords({dim: name}) for ds, name in zip(datasets, names)]
    out = xr.concat(
        labelled,
        dim=dim,
        data_vars="all",
        coords="different",
        compat="equals",
        join="outer",
        combine_attrs="drop_conflicts",
    )
    out.attrs = {k: v for k, v in out.attrs.items() if k not in differing}
    return out.assign_coords(per_checkpoint)

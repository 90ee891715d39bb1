"""The study runner's result cache: one engine result per (checkpoint, diagnostic[, untrained twin]), as netCDF.

Every study (report, compare, sweep, track, the API's studies) asks it before running an engine, so a second
report on the same checkpoints, a track rerun after new snapshots, or a docs page that repeats another page's
command reads what was computed instead of computing it again.

* Where: `$DEPTHLENS_RESULTS_CACHE`, else `<$DEPTHLENS_CACHE or ~/.cache/depthlens>/results`, one file per result:
  `<key[:2]>/<key>.nc`. Off with `depthlens --no-cache <command>`, `DEPTHLENS_NO_CACHE=1` (the GGUF cache's
  switch: one switch for every cache), `DEPTHLENS_RESULTS_CACHE=off` (this cache only) or
  `StudyOptions(cache=False)`. Cleared by removing the folder.
* Key: SHA-256 of everything the result depends on (`key`): the checkpoint's bytes (every regular file at the top
  of its directory, or the GGUF file), its absolute path (recorded in the result's provenance), the eval data's
  provenance (token SHA-256, source, seed, tokenizer), the diagnostic, its engine options, the untrained twin's
  initialisation, the --precision target, device, device map, dtype and torch thread count, the versions of the
  numerical libraries, and a fingerprint of depthlens's own source code (every .py file of the package). Any code
  change makes every entry stale: a result is never served from code that would compute it differently.
  batch_size and threads are in the key although results do not depend on them, so a test of that claim can
  never be answered from the cache.
* Not cached (always computed): a diagnostic whose engine lives outside the depthlens package (a plug-in: its
  code is not in the fingerprint) and a described model (FILE.py:FUNCTION: the file may import code of its own).
* Written atomically (`io.dataset.write_netcdf`: a temp file, then a rename), so two processes storing the same
  key leave one whole file. Read defensively: an entry that does not load as netCDF, or whose stored key differs,
  is removed and recomputed, never an error. Nothing is ever unpickled: entries are netCDF only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthlens.errors import DepthlensError

if TYPE_CHECKING:
    import xarray as xr

    from depthlens.runtime.evaldata import EvalData

FORMAT = 1  # bump when the entry layout changes
KEY_ATTR = "results_cache_key"  # the entry's key, stored in the file and checked on every read
PACKAGE = Path(__file__).resolve().parents[1]  # the depthlens package this module belongs to
LIBRARIES = ("torch", "numpy", "scipy", "xarray", "netCDF4", "transformers", "gguf")


OFF = "off"  # DEPTHLENS_RESULTS_CACHE=off: no result cache (the GGUF cache stays; the test suite's default)


def enabled(cache: bool | None = None) -> bool:
    """`cache` when given, else on unless DEPTHLENS_RESULTS_CACHE is "off" or DEPTHLENS_NO_CACHE is set (to
    anything but 0/empty), the GGUF cache's switch (`depthlens --no-cache` sets it)."""
    if cache is not None:
        return cache
    if os.environ.get("DEPTHLENS_RESULTS_CACHE") == OFF:
        return False
    return os.environ.get("DEPTHLENS_NO_CACHE", "") in ("", "0")


def cache_dir() -> Path:
    """$DEPTHLENS_RESULTS_CACHE, else <$DEPTHLENS_CACHE or ~/.cache/depthlens>/results."""
    env = os.environ.get("DEPTHLENS_RESULTS_CACHE")
    if env:
        return Path(env)
    from depthlens.runtime.evaldata import cache_dir as root

    return root() / "results"


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 of every .py file of the installed depthlens package (relative path and bytes), and of the numerical
    libraries' versions: a change to any of them makes every cache entry stale."""
    from importlib import metadata

    pkg = PACKAGE
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(f"{f.relative_to(pkg).as_posix()}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    for lib in LIBRARIES:
        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:
            version = "-"
        h.update(f"{lib}={version}\0".encode())
    return h.hexdigest()


def weights_id(path: Path) -> str:
    """SHA-256 of a model's bytes: a GGUF file's content, or every regular file at the top of a checkpoint
    directory (name, size, bytes; config, weights, tokenizer and training records alike)."""
    from depthlens.io.dataset import checkpoint_sha256, sha256_file

    if path.is_file():
        return sha256_file(path)
    return checkpoint_sha256(path, sorted(p.name for p in path.iterdir() if p.is_file()))


def _engine_in_package(metric: str) -> bool:
    """Whether diagnostic `metric`'s engine is depthlens code (covered by `code_fingerprint`)."""
    import inspect

    from depthlens.diagnostics import registry

    try:
        # unwrapped: a decorated engine (torch.no_grad) is defined where its decorator's wrapper is not
        src = inspect.getsourcefile(inspect.unwrap(registry.get(metric).loaded().engine))
    except (TypeError, OSError):
        return False
    return src is not None and Path(src).resolve().is_relative_to(PACKAGE)


def folder_in_use(cache: bool | None = None) -> str | None:
    """The folder a study with option `cache` reads and writes, None when the cache is off."""
    return str(cache_dir()) if enabled(cache) else None


@dataclass
class Tally:
    """Where a study's engine results came from, for the terminal and the provenance (never in a result file:
    a rerun must write the same bytes)."""

    folder: str | None  # None: the cache was off
    results: int = 0
    from_cache: int = 0

    def add(self, results: int, from_cache: int) -> None:
        self.results += results
        self.from_cache += from_cache

    def line(self) -> str:
        """'results: 3 computed, 5 from the cache (<folder>)', or that the cache was off."""
        if self.folder is None:
            return f"results: {self.results} computed (result cache off)"
        return f"results: {self.results - self.from_cache} computed, {self.from_cache} from the cache ({self.folder})"


class ResultCache:
    """The cache as one study uses it: `fetch(...)` returns the stored result or computes and stores it, and counts
    both. root None: off (every fetch computes)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.hits = 0
        self.computed = 0
        self._weights: dict[str, str] = {}  # per study: a checkpoint rewritten between studies is hashed again

    @classmethod
    def for_study(cls, cache: bool | None = None) -> ResultCache:
        return cls(cache_dir() if enabled(cache) else None)

    def key(
        self,
        checkpoint: Path,
        loaded: Any,
        metric: str,
        data: EvalData,
        options: Mapping[str, Any],
        **context: Any,
    ) -> str | None:
        """The entry's key, or None when this result is not cached (cache off, a plug-in engine, a described
        model, a checkpoint that is not a file or directory). loaded: the model loaded from `checkpoint`.
        context: the rest of what the result depends on (device, dtype, untrained init, precision...)."""
        if self.root is None or getattr(loaded, "adapter_path", None) == "described":
            return None
        if not _engine_in_package(metric):
            return None
        import torch

        where = os.path.abspath(checkpoint)
        if where not in self._weights:
            try:
                self._weights[where] = weights_id(Path(checkpoint))
            except (OSError, DepthlensError):  # not a checkpoint on disk (or unreadable now): computed, not cached
                return None
        blob = {
            "format": FORMAT,
            "code": code_fingerprint(),
            "weights": self._weights[where],
            "checkpoint": where,
            "eval": data.provenance(),
            "metric": metric,
            "options": dict(options),
            "threads": torch.get_num_threads(),
            **context,
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=repr).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.nc"

    def load(self, key: str) -> xr.Dataset | None:
        """The stored result of `key`, or None (missing; a damaged or foreign entry is removed)."""
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            from depthlens.io.dataset import read_netcdf

            ds = read_netcdf(path)
        except Exception:  # a truncated, foreign or unreadable file: recomputed and replaced, never an error
            ds = None
        if ds is None or ds.attrs.pop(KEY_ATTR, None) != key:
            self._discard(path)
            return None
        # as the engine returned it: no trace of the file (its chunking and compression would follow the dataset
        # into the report's merged files, where netCDF refuses them for another shape)
        ds.encoding = {}
        for v in ds.variables.values():
            v.encoding = {}
        return ds

    def store(self, key: str, ds: xr.Dataset) -> None:
        """Store `ds` under `key` atomically; a cache that cannot be written (read-only, full disk, a dataset
        netCDF cannot hold) leaves the study as it is, uncached."""
        from depthlens.io.dataset import write_netcdf

        path = self._path(key)
        out = ds.copy(deep=False)
        out.attrs = {**ds.attrs, KEY_ATTR: key}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._discard(path)
            write_netcdf(out, path, overwrite=True)
        except (OSError, ValueError, TypeError, RuntimeError, DepthlensError):
            self._discard(path)

    @staticmethod
    def _discard(path: Path) -> None:
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)

    def fetch(self, key: str | None, compute: Callable[[], xr.Dataset]) -> tuple[xr.Dataset, bool]:
        """(the result, whether it came from the cache): the stored one under `key`, else `compute()` stored."""
        if key is not None:
            ds = self.load(key)
            if ds is not None:
                self.hits += 1
                return ds, True
        ds = compute()
        self.computed += 1
        if key is not None:
            self.store(key, ds)
        return ds, False

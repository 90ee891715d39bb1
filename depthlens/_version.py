"""The package version, read from the installed metadata (equinox style).

Its own module so io, adapters and analysis can record it without importing the package root back
(which would be an import cycle). A source tree that is not installed reports "0+unknown".

Read on first use (`from depthlens._version import __version__` or `depthlens.__version__`), not at import:
importlib.metadata costs a fifth of `depthlens --help`, which never shows the version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    __version__: str


def _read() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("depthlens")
    except PackageNotFoundError:  # running from a checkout that pip never installed
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        v = _read()
        globals()["__version__"] = v  # read once
        return v
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

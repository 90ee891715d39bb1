"""The package version, read from the installed metadata (equinox style).

Its own module so io, adapters and analysis can record it without importing the package root back
(which would be an import cycle). A source tree that is not installed reports "0+unknown".
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("depthlens")
except PackageNotFoundError:  # running from a checkout that pip never installed
    __version__ = "0+unknown"

"""The `depthlens` command line. Heavy imports (torch, xarray, ...) happen inside commands."""

from .app import app

__all__ = ["app"]

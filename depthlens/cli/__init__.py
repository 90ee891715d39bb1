"""The `depthlens` command line. Heavy imports (torch, xarray, ...) happen inside commands."""

from .app import app

# The command modules, listed here (not imported back by app.py, which they import): each decorates its
# commands onto `app`. Light at import time: heavy imports stay inside the commands.
from . import analyze, info, hooks, data, evaluate, shapes, report, track, train, prune, plan, cache  # noqa: E402,F401  (registers commands; isort: skip)
from . import diagnostic  # noqa: E402,F401  (the generic command of every other registry diagnostic; isort: skip)

__all__ = ["app"]

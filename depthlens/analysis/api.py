"""Deprecated alias of `depthlens.studies.api` (the Python API moved there; `import depthlens as dl` is the
entry point). Importing it warns once; every name resolves to the new module's."""

from __future__ import annotations

import warnings
from typing import Any

warnings.warn(
    "depthlens.analysis.api is deprecated and will be removed in the next version; use `import depthlens as dl` "
    "(dl.causal, dl.permute, ...) or depthlens.studies.api",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    from depthlens.studies import api

    return getattr(api, name)

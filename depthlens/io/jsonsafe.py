"""One JSON-safe converter for every JSON the package writes (checkpoint records, report files, CLI --json).

NaN and ±inf become null (JSON has no NaN; a reader must not mistake a missing value for a number), numpy
scalars become Python numbers, tuples become lists, paths become strings, dict keys become strings.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any


def finite_or_none(x: Any) -> float | None:
    """A float, or None for NaN/inf/None/anything that is not a number."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def jsonable(x: Any) -> Any:
    """`x` with every nested value made JSON-safe (see the module docstring); other objects pass through."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    np = sys.modules.get("numpy")  # a numpy value exists only once numpy is imported (`--help` never imports it)
    if isinstance(x, (bool, np.bool_) if np else bool):
        return bool(x)
    if isinstance(x, (int, np.integer) if np else int):
        return int(x)
    if isinstance(x, (float, np.floating) if np else float):
        return finite_or_none(x)
    if isinstance(x, Path):
        return str(x)
    return x

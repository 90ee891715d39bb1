"""What `depthlens permute` asks of the engine and the headline (`plan`), and what it prints besides them (`lines`):
its hook `command` (`spec.OwnCommand`; cli/diagnostic.py builds the command from the spec)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .headline import PERM_ABS, PERM_KL, PERM_REL

if TYPE_CHECKING:
    import xarray as xr

SYMBOLS = {s.key: s.symbol for s in (PERM_ABS, PERM_REL, PERM_KL)}


def plan(opts: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The score --metric (nothing to pick on its matrix) over the pairs --layers, swapping --swap."""
    return opts["metric"], {}, {"pairs": opts["layers"], "swap": opts["swap"]}


def lines(ds: xr.Dataset, h: Mapping[str, Any], opts: Mapping[str, Any], share: str) -> tuple[list[str], list[str]]:
    """--verbose: the definition, the clean loss and the share."""
    clean = f"clean loss {h.get('clean_loss', float('nan')):.4f} nats"
    return [f"  {h['definition']}", f"  {clean}; share {SYMBOLS[opts['metric']]} > {opts['threshold']}: {share}"], []

"""What `depthlens causal` asks of the engine and the headline (`plan`), and what it prints besides them (`lines`):
its hook `command` (`spec.OwnCommand`; cli/diagnostic.py builds the command from the spec)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .headline import CAUSAL

if TYPE_CHECKING:
    import xarray as xr


def plan(opts: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """C read at --aggregator and --variant; the engine runs the future variant only when it is the one read."""
    variants = ("current", "future") if opts["variant"] == "future" else ("current",)
    engine = {k: opts[k] for k in ("layers", "unit", "norm", "direct", "outputs")}
    return CAUSAL.key, {"aggregator": opts["aggregator"], "variant": opts["variant"]}, {"variants": variants, **engine}


def lines(ds: xr.Dataset, h: Mapping[str, Any], opts: Mapping[str, Any], share: str) -> tuple[list[str], list[str]]:
    """--verbose: the definition, the share, the noise floor; with --outputs, the layer whose skip costs most, in
    loss and in output distribution."""
    from .dataset import skip_summary

    verbose = [
        f"  {h['definition']}, unit={opts['unit']}",
        f"  share {CAUSAL.symbol} > {opts['threshold']}: {share}",
        f"  noise floor (null intervention): {h.get('noise_floor', float('nan')):.2e}",
    ]
    k = skip_summary(ds)
    if k is None:
        return verbose, []
    return verbose, [
        f"layer-skip loss ΔL_skip: max {k['max_skip_loss']:.3f} nats at layer {k['max_skip_loss_layer']}, "
        f"mean {k['mean_skip_loss']:.3f}; output effect O: max {k['max_output_effect']:.3f} at layer "
        f"{k['max_output_effect_layer']}"
    ]

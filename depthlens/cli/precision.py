"""--precision: run a diagnostic until its headline share's 95 % interval is narrow enough (studies/precision.py)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

PrecisionOpt = Annotated[
    float | None,
    typer.Option(
        "--precision",
        help="Stop when the headline share's 95 % interval half-width is at most this (e.g. 0.03): the eval set "
        "grows in doublings from 16 sequences, new sequences only, up to --n-seq.",
    ),
]


def run(name: str, model: Any, data: Any, precision: float | None, headline_kw: dict[str, Any], **opts: Any) -> Any:
    """`registry.run(name, ...)`, or with `precision` the doubling run of `studies.precision.to_precision`."""
    from ..diagnostics import registry

    if precision is None:
        return registry.run(name, model, data, **opts)
    from ..studies.precision import to_precision

    metric = headline_kw.pop("metric", None)
    return to_precision(name, model, data, precision, headline_kw=headline_kw, metric=metric, **opts)


def line(ds: Any) -> list[str]:
    """One line on what --precision did (nothing without it)."""
    a = ds.attrs
    if "precision_target" not in a:
        return []
    how = "the cap (--n-seq) stopped it" if a["precision_cap_hit"] else "target reached"
    return [
        f"precision: ±{a['precision_half_width']:.3f} at {a['precision_n_seq']} sequences "
        f"(target ±{a['precision_target']:g}; {how})"
    ]

"""The logit lens and the tuned lens: KL to the final layer, target rank and top-1 agreement at every layer
boundary (docs/concepts.md).

    engine.py   the readouts, the trained affine translators of the tuned lens
    summary.py  the report record (where the prediction forms) and the terminal view
    figure.py   one checkpoint's KL and agreement curves over relative depth

This file is the spec the registry reads (light: its loaders import the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..spec import Column, Diagnostic, Hooks

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..spec import Engine


def _logit_engine() -> Engine:
    from .engine import logit_lens

    return logit_lens


def _tuned_engine() -> Engine:
    from .engine import tuned_lens

    return tuned_lens


def _hooks_of(kind: str) -> Callable[[], Hooks]:
    """The loader of the `kind` lens's hooks; its report row names its fields `<kind>_lens_forms`, ..."""

    def load() -> Hooks:
        from .figure import fig_lens
        from .summary import lens_view, record_of

        return Hooks(figure=fig_lens, record=record_of(kind), view=lens_view)

    return load


SUMMARIES = {  # kind -> (engine, one line for help texts)
    "logit": (
        _logit_engine,
        "logit lens: KL to the final layer, target rank and top-1 agreement at every layer boundary",
    ),
    "tuned": (
        _tuned_engine,
        "tuned lens (trained affine translators): KL to the final layer, target rank, top-1 agreement",
    ),
}
SPECS = tuple(
    Diagnostic(
        f"{kind}_lens",
        engine,
        summary,
        hooks=_hooks_of(kind),
        aliases=(f"{kind}lens",),
        title=f"{kind.capitalize()} lens: KL to the final layer and top-1 agreement by relative depth",
        record_fields=tuple(
            f"{kind}_lens_{k}" for k in ("forms", "forms_low", "forms_high", "kl_mid", "agree_mid", "forms_at")
        ),
        untrained_fields=(f"{kind}_lens_forms",),
        columns=(Column(f"{kind} lens forms at l/L", f"{kind} forms", f"{kind}_lens_forms", ".2f"),),
    )
    for kind, (engine, summary) in SUMMARIES.items()
)

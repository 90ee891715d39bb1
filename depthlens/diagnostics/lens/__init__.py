"""The logit lens and the tuned lens: KL to the final layer, target rank and top-1 agreement at every layer
boundary (docs/concepts.md).

    engine.py   the readouts, the trained affine translators of the tuned lens
    summary.py  the report record (where the prediction forms) and the terminal view
    figure.py   one checkpoint's KL and agreement curves over relative depth

This file is the spec the registry reads (light: each lens's loader imports the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..spec import Column, Diagnostic, Hooks

if TYPE_CHECKING:
    from collections.abc import Callable


def _loader(kind: str) -> Callable[[], Hooks]:
    """The loader of the `kind` lens (its engine `<kind>_lens`); its report row names its fields `<kind>_lens_forms`,
    ..."""

    def load() -> Hooks:
        from .engine import logit_lens, tuned_lens
        from .figure import fig_lens
        from .summary import lens_view, record_of

        engine = {"logit": logit_lens, "tuned": tuned_lens}[kind]
        return Hooks(engine, figure=fig_lens, record=record_of(kind), view=lens_view)

    return load


SUMMARIES = {  # kind -> one line for help texts
    "logit": "logit lens: KL to the final layer, target rank and top-1 agreement at every layer boundary",
    "tuned": "tuned lens (trained affine translators): KL to the final layer, target rank, top-1 agreement",
}
SPECS = tuple(
    Diagnostic(
        f"{kind}_lens",
        _loader(kind),
        summary,
        aliases=(f"{kind}lens",),
        title=f"{kind.capitalize()} lens: KL to the final layer and top-1 agreement by relative depth",
        record_fields=tuple(
            f"{kind}_lens_{k}" for k in ("forms", "forms_low", "forms_high", "kl_mid", "agree_mid", "forms_at")
        ),
        untrained_fields=(f"{kind}_lens_forms",),
        columns=(Column(f"{kind} lens forms at l/L", f"{kind} forms", f"{kind}_lens_forms", ".2f"),),
    )
    for kind, summary in SUMMARIES.items()
)

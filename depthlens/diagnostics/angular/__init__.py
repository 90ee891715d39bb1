"""The angular distance D_n(l) between residual states (Gromov et al. 2024; docs/concepts.md).

    engine.py   the distances, the report record, the track series, the terminal view
    figure.py   one checkpoint's heatmap over start layer and block size

This file is the spec the registry reads (light: its loaders import the modules when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import frozen
from ..spec import Diagnostic, Hooks, Option

if TYPE_CHECKING:
    from ..spec import Engine


def _engine() -> Engine:
    from .engine import angular_distances

    return angular_distances


def _hooks() -> Hooks:
    from .engine import angular_record, angular_track, angular_view
    from .figure import fig_angular

    return Hooks(figure=fig_angular, record=angular_record, track=angular_track, view=angular_view)


SPECS = (
    Diagnostic(
        "angular",
        _engine,
        "angular distance D_n(l) between residual states (Gromov et al. 2024)",
        hooks=_hooks,
        options=(
            Option("positions", str, "last", "last | all (BOS excluded)", choices=("last", "all")),
            Option(
                "repr", str, "view", "view | flatten (HC/mHC) | input (AttnRes)", choices=("view", "flatten", "input")
            ),
        ),
        title="Angular distance d(h_ℓ, h_ℓ+n)",
        record_fields=("angular_d1_mean",),
        untrained=False,
        report_opts=frozen(positions="all"),
    ),
)

"""The angular distance D_n(l) between residual states (Gromov et al. 2024; docs/concepts.md).

engine.py   the distances, the report record, the track series, the terminal view
figure.py   one checkpoint's heatmap over start layer and block size
"""

from __future__ import annotations

from ..scores import frozen
from ..spec import Diagnostic, Hooks, Option


def _load() -> Hooks:
    from .engine import angular_distances, angular_record, angular_track, angular_view
    from .figure import fig_angular

    return Hooks(angular_distances, figure=fig_angular, record=angular_record, track=angular_track, view=angular_view)


ANGULAR_SPEC = Diagnostic(
    "angular",
    summary="angular distance D_n(l) between residual states (Gromov et al. 2024)",
    options=(
        Option("positions", str, "last", "last | all (BOS excluded)", choices=("last", "all")),
        Option("repr", str, "view", "view | flatten (HC/mHC) | input (AttnRes)", choices=("view", "flatten", "input")),
    ),
    title="Angular distance d(h_ℓ, h_ℓ+n)",
    record_fields=("angular_d1_mean",),
    untrained=False,
    report_opts=frozen(positions="all"),
    load=_load,
)
SPECS = (ANGULAR_SPEC,)

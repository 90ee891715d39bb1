"""The angular distance D_n(l) between residual states (Gromov et al. 2024; docs/concepts.md).

    engine.py   the distances, the report record, the track series, the terminal view
    figure.py   one checkpoint's heatmap over start layer and block size

This file is the spec the registry reads (light: each hook imports its module when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scores import frozen
from ..spec import Diagnostic, Option

if TYPE_CHECKING:
    from ..spec import Engine, Figure, Record, Track, View


def _engine() -> Engine:
    from .engine import angular_distances

    return angular_distances


def _figure() -> Figure:
    from .figure import fig_angular

    return fig_angular


def _record() -> Record:
    from .engine import angular_record

    return angular_record


def _track() -> Track:
    from .engine import angular_track

    return angular_track


def _view() -> View:
    from .engine import angular_view

    return angular_view


SPECS = (
    Diagnostic(
        "angular",
        _engine,
        "angular distance D_n(l) between residual states (Gromov et al. 2024)",
        options=(
            Option("positions", str, "last", "last | all (BOS excluded)", choices=("last", "all")),
            Option(
                "repr", str, "view", "view | flatten (HC/mHC) | input (AttnRes)", choices=("view", "flatten", "input")
            ),
        ),
        view=_view,
        figure=_figure,
        title="Angular distance d(h_ℓ, h_ℓ+n)",
        record=_record,
        record_fields=("angular_d1_mean",),
        track=_track,
        untrained=False,
        report_opts=frozen(positions="all"),
    ),
)

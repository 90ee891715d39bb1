"""Schemas of the training records depthlens reads back: a checkpoint's train.json and a snapshot's snapshot.json.

Written by the trainer, read by `info`, `report` and `track`; a hand-edited or foreign record is checked here
(depthlens.schema) so a wrong type is one line naming the file and the field, not a traceback later. Fields the
readers do not use are kept as they are (extra="allow"): a record is provenance, not configuration.
"""

from __future__ import annotations

import functools
from typing import Any

from ..schema import validate


@functools.cache
def _schemas() -> tuple[Any, Any]:
    from typing import Annotated

    from annotated_types import Ge
    from pydantic import BaseModel, ConfigDict

    Count = Annotated[int, Ge(0)]

    class TrainRecord(BaseModel):
        """train.json: what the run was, how far it got, its final validation loss."""

        model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
        name: str | None = None  # the recipe's run name
        steps: Count | None = None  # optimizer steps done
        tokens: Annotated[float, Ge(0)] | None = None  # training tokens seen
        final_val_loss: float | None = None  # null when it was not finite
        recipe: dict[str, Any] | None = None  # the RunConfig fields the run was trained with

    class SnapshotRecord(BaseModel):
        """snapshot.json: a model-only analysis snapshot taken during training."""

        model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
        step: Count  # optimizer steps done when it was written
        tokens: Annotated[float, Ge(0)] | None = None
        val_loss: float | None = None
        run: str | None = None

    return TrainRecord, SnapshotRecord


def check_train_record(data: dict[str, Any], where: Any) -> dict[str, Any]:
    """`data` (a parsed train.json) if it fits the schema; SchemaError naming `where` and the field."""
    validate(_schemas()[0], data, where)
    return data


def check_snapshot_record(data: dict[str, Any], where: Any) -> dict[str, Any]:
    """`data` (a parsed snapshot.json) if it fits the schema; SchemaError naming `where` and the field."""
    validate(_schemas()[1], data, where)
    return data

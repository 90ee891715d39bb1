"""Moved to `depthlens.analysis.ranks` (the study runner spreads checkpoints over torchrun ranks)."""

from depthlens.analysis.ranks import assign, attempt, cost, pack, unpack  # noqa: F401

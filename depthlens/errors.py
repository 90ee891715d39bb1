"""Errors that the CLI turns into one clear line on stderr (exit 1), never a traceback."""


class DepthlensError(Exception):
    """A domain error: bad checkpoint, bad data, out-of-range option. The message is user-facing."""


class CheckpointError(DepthlensError):
    """A checkpoint directory is missing, incomplete, corrupt, or inconsistent."""


class DataError(DepthlensError):
    """An eval/training data file is missing, empty, not UTF-8, or too short."""


class UsageError(ValueError):
    """A bad option or argument value (unknown metric name, out-of-range option): the CLI says it in one line and
    exits 2. The one way every layer signals a usage error (a ValueError, so library callers can catch either)."""

    usage = True

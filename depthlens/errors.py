"""Errors that the CLI turns into one clear line on stderr (exit 1), never a traceback."""


class DepthlensError(Exception):
    """A domain error: bad checkpoint, bad data, out-of-range option. The message is user-facing."""


class CheckpointError(DepthlensError):
    """A checkpoint directory is missing, incomplete, corrupt, or inconsistent."""


class DataError(DepthlensError):
    """An eval/training data file is missing, empty, not UTF-8, or too short."""


class UsageError(DepthlensError, ValueError):
    """A bad option or argument value (unknown metric name, out-of-range option, a malformed command line): the CLI
    says it in one line and exits 2. The one way every layer signals a usage error (a ValueError too, so library
    callers can catch either)."""

    usage = True


class SchemaError(DepthlensError, ValueError):
    """A structured input (recipe, config, manifest, device map, ...) breaks its schema (depthlens.schema).

    One line: `<file>: field '<name>': <what was expected>, got <value>`. `usage` is set when the field came
    from the command line (a `key=value` override): the CLI then exits 2, else 1.
    """

    def __init__(self, message: str, field: str | None = None, where: str = "", usage: bool = False):
        self.message, self.field, self.where, self.usage = message, field, where, usage
        head = ": ".join(p for p in (where, f"field {field!r}" if field else "") if p)
        super().__init__(f"{head}: {message}" if head else message)

    def within(self, prefix: str) -> "SchemaError":
        """The same error for a field nested under `prefix` (model.n_head)."""
        return SchemaError(self.message, f"{prefix}.{self.field}" if self.field else prefix, self.where, self.usage)

    def at(self, where: str, usage: bool = False) -> "SchemaError":
        """The same error located in file `where` (kept if it already names one)."""
        return SchemaError(self.message, self.field, self.where or where, self.usage or usage)

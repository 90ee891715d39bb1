"""The schema layer: every structured input is checked here, in one way, with one kind of error.

Recipes, run and model configs, train/snapshot records, shard manifests, tokenizer configs, device maps and
GGUF headers are validated against pydantic (v2) models. A dataclass that documents an input (ModelConfig,
RunConfig: every field says why) stays a plain dataclass; its annotations carry the per-field rules
(`Annotated[int, Gt(0)]`, `OneOf(...)`), `mirror(cls)` builds the pydantic model from them (strict types, no
unknown keys, finite floats), and the dataclass's `__post_init__` runs it, then its cross-field rules
(`require`). Plain JSON shapes (manifests, recipe grids) are pydantic models of their own.

Every violation is a `SchemaError`: one line naming the file, the field and what was expected, e.g.

    recipe.json: field 'lr': expected a valid number, got 'abc'

pydantic is imported on first use, not at import time (`depthlens --help` stays instant).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, get_type_hints

from .errors import SchemaError

__all__ = [
    "LAX",
    "PATH_TEXT",
    "Check",
    "OneOf",
    "SchemaError",
    "build",
    "check_dataclass",
    "mirror",
    "one_line",
    "require",
    "validate",
]


class Check:
    """Annotation marker: `test(value)` must hold; `expected` says what the value should be."""

    def __init__(self, test: Any, expected: str):
        self.test, self.expected = test, expected

    def __call__(self, v: Any) -> Any:
        if not self.test(v):
            raise ValueError(self.expected)
        return v


class OneOf(Check):
    """Annotation marker: the value must be one of `values` (a closed vocabulary such as design slugs)."""

    def __init__(self, *values: Any):
        self.values = tuple(values)
        super().__init__(lambda v: v in self.values, f"one of {', '.join(map(str, self.values))}")


PATH_TEXT = Check(lambda s: "\0" not in s, "a path (no NUL byte)")  # a NUL byte makes every os call fail


LAX = object()  # annotation marker: accept the JSON form of the container (a list for a tuple); items stay strict


_UNION_TAGS = ("str", "int", "float", "bool", "list", "dict", "none", "tuple")


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and (part in _UNION_TAGS or "[" in part or "(" in part):
            continue  # pydantic's name for a union member or a validator, not a field
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _got(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected(err: dict[str, Any]) -> str:
    msg, kind = str(err.get("msg", "")), str(err.get("type", ""))
    if kind == "extra_forbidden":
        return "unknown field (a typo?); expected one of the documented fields"
    if kind == "missing":
        return "missing; expected a value (the field is required)"
    for prefix in ("Value error, ", "Input should be ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    return "expected " + msg[:1].lower() + msg[1:]


def one_line(e: Any, where: str = "", prefix: str = "") -> SchemaError:
    """A pydantic ValidationError as one SchemaError line (the first violation; the count when more)."""
    errors = e.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(e), "type": ""}
    field = ".".join(p for p in (prefix, _loc(tuple(first.get("loc", ())))) if p)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    got = "" if first.get("type") in ("missing",) else f", got {_got(first.get('input'))}"
    return SchemaError(f"{_expected(first)}{got}{more}", field=field or None, where=where)


def require(cond: bool, field: str, message: str) -> None:
    """A cross-field rule: SchemaError naming `field` when `cond` does not hold."""
    if not cond:
        raise SchemaError(message, field=field)


def _pydantic_type(tp: Any) -> Any:
    """An annotation with our OneOf markers turned into pydantic AfterValidators."""
    from typing import Annotated, get_args, get_origin

    from pydantic import AfterValidator

    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        from pydantic import Strict

        meta = [AfterValidator(m) if isinstance(m, Check) else Strict(False) if m is LAX else m for m in meta]
        return Annotated[(base, *meta)] if meta else base
    return tp


@functools.cache
def mirror(cls: type) -> Any:
    """The pydantic model of dataclass `cls`: its fields, types and per-field rules, strict (no "4" for 4, no
    1.0 for an int, no 0/1 for a bool), no unknown keys, finite floats. Cached per class."""
    from pydantic import ConfigDict, Field, create_model

    hints = get_type_hints(cls, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        default = (
            Field(default_factory=f.default_factory)
            if f.default_factory is not dataclasses.MISSING
            else f.default
            if f.default is not dataclasses.MISSING
            else ...
        )
        fields[f.name] = (_pydantic_type(hints[f.name]), default)
    config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
    return create_model(f"{cls.__name__}Schema", __config__=config, **fields)


def check_dataclass(obj: Any) -> None:
    """Validate a dataclass instance's fields against `mirror(type(obj))` (called from `__post_init__`); the
    validated values are written back (a JSON list becomes the declared tuple, an int the declared float)."""
    from pydantic import ValidationError

    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    cls: type = type(obj)  # a plain `type` (mypy takes type[Any] for no Hashable, the cache's argument type)
    try:
        checked = mirror(cls).model_validate(values)
    except ValidationError as e:
        raise one_line(e) from None
    for name in values:
        object.__setattr__(obj, name, getattr(checked, name))


def build(cls: type, data: Any, where: Any = "", *, prefix: str = "", usage_fields: Any = ()) -> Any:
    """`cls(**data)` for a dataclass validated by the schema layer: unknown keys, wrong types, ranges and the
    class's cross-field rules, as one SchemaError line naming `where` (the file) and the field. A violation in a
    field of `usage_fields` (given on the command line, e.g. a `key=value` override) is a usage error (exit 2)."""
    from pydantic import ValidationError

    try:
        if not isinstance(data, dict):
            raise SchemaError(
                f"expected an object of {cls.__name__} fields, got {type(data).__name__}", field=prefix or None
            )
        mirror(cls).model_validate(data)  # unknown keys and types, before the constructor sees them
        return cls(**data)
    except ValidationError as e:
        err = one_line(e, prefix=prefix)
    except SchemaError as e:
        err = e.within(prefix) if prefix and not (e.field or "").startswith(prefix) else e
    top = (err.field or "").removeprefix(prefix + "." if prefix else "").split(".")[0].split("[")[0]
    usage = bool(top) and top in set(usage_fields)
    raise err.at("key=value override" if usage else str(where), usage=usage) from None


def validate(model: Any, data: Any, where: Any = "", *, usage: bool = False) -> Any:
    """`model.model_validate(data)` (a pydantic model or a TypeAdapter-able type) as one SchemaError line."""
    from pydantic import BaseModel, ValidationError

    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        return _adapter(model).validate_python(data)
    except ValidationError as e:
        raise one_line(e, where=str(where)).at(str(where), usage=usage) from None


@functools.cache
def _adapter(tp: Any) -> Any:
    from pydantic import ConfigDict, TypeAdapter

    return TypeAdapter(tp, config=None if hasattr(tp, "__pydantic_config__") else ConfigDict(strict=True))

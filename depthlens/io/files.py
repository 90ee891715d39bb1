"""One way to open a user file: asked what it is before it is read, capped in size, one line when it fails.

Every JSON or text file named by a user (config.json, train.json, recipes, manifests, tokenizer configs,
--device-map, track --recipe, --data, prepare inputs) is read through this module, and every JSON a user can hand
depthlens (JSONL lines, safetensors headers, markers, resume state too) is parsed by `strict_json`:

* `regular_file`: a regular file (symlinks followed). A FIFO would block for ever, /dev/zero never ends, a
  socket or a device is not data: each is refused by name, as is a directory; `/dev/stdin` only where the
  command documents it (`allow_stdin`).
* a size cap per kind, checked on the stat before a byte is read (`CONFIG_MAX` for JSON configs, `TEXT_MAX`
  for text corpora read whole); a `MemoryError` while reading or parsing becomes the same one line.
* `read_json`: a `RecursionError` from JSON nested 100,000 deep is one line, not a traceback; a duplicate key,
  NaN or Infinity, or a 5,000-digit integer is refused naming the file (`strict_json`).

Errors are the caller's class (CheckpointError, DataError, ...) so a command keeps its exit code.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DepthlensError

CONFIG_MAX = 32 << 20  # JSON configs, recipes, manifests, maps: the largest real one (a 1,000-run grid) is < 2 MiB
TEXT_MAX = 2 << 30  # a text corpus read whole (eval --data, prepare inputs): 2 GiB, then split it into files
STDIN = "/dev/stdin"


def _kind(mode: int) -> str:
    return (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a character device"
        if stat.S_ISCHR(mode)
        else "a block device"
        if stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )


def path_mode(path: str | os.PathLike[str], unreadable: Callable[[str], Exception]) -> int | None:
    """What is at `path`: its `st_mode` (symlinks followed), asked by a stat before anything opens it, so a FIFO
    cannot block and a device is never read; None when nothing is there. When the OS will not say (no
    permission on a parent, a loop of links, a file where a directory belongs), `unreadable(reason)` is raised
    with the OS's words for why ("Permission denied"): one line in the caller's wording and error class."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise unreadable(e.strerror or str(e) or e.__class__.__name__) from None


def regular_file(
    path: str | os.PathLike[str], what: str, *, error: type[Exception] = DepthlensError, allow_stdin: bool = False
) -> Path:
    """`path` if it is a regular file; else `error` naming what it is (missing, a directory, a FIFO, ...)."""
    path = Path(path)
    if allow_stdin and str(path) in (STDIN, "-"):
        return Path(STDIN)
    mode = path_mode(path, lambda why: error(f"{path}: cannot read {what} ({why})"))
    if mode is None:
        raise error(f"{path}: no such file ({what})")
    if not stat.S_ISREG(mode):
        raise error(f"{path}: is {_kind(mode)}; {what} must be a regular file")
    return path


def read_bytes(
    path: str | os.PathLike[str],
    what: str,
    *,
    max_bytes: int = CONFIG_MAX,
    error: type[Exception] = DepthlensError,
    allow_stdin: bool = False,
) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (checked before reading)."""
    path = regular_file(path, what, error=error, allow_stdin=allow_stdin)
    try:
        if str(path) == STDIN:
            data = os.fdopen(os.dup(0), "rb").read(max_bytes + 1)
        else:
            size = path.stat().st_size
            if size > max_bytes:
                raise error(f"{path}: {size:,} bytes is too large for {what} (at most {max_bytes:,})")
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)  # a file that grew since the stat is still capped
    except MemoryError:
        raise error(f"{path}: out of memory reading {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror or e.__class__.__name__})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: too large for {what} (more than {max_bytes:,} bytes)")
    return data


def read_text(
    path: str | os.PathLike[str],
    what: str,
    *,
    max_bytes: int = CONFIG_MAX,
    error: type[Exception] = DepthlensError,
    allow_stdin: bool = False,
) -> str:
    """The UTF-8 text of a regular file (see `read_bytes`)."""
    data = read_bytes(path, what, max_bytes=max_bytes, error=error, allow_stdin=allow_stdin)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not valid UTF-8 (byte {e.start})") from None
    except MemoryError:
        raise error(f"{path}: out of memory reading {what}") from None


MAX_INT_DIGITS = 1000  # an integer in a depthlens input (ids, sizes, seeds) has far fewer digits


class StrictJSONError(ValueError):
    """JSON that parses but is not a depthlens input: a duplicate key, NaN or Infinity, an overlong integer."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJSONError(f"has the key {k[:80]!r} twice (which one is meant?)")
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise StrictJSONError(f"holds {name}, which is not a number")


def _float(text: str) -> float:
    x = float(text)
    if x != x or x in (float("inf"), float("-inf")):
        raise StrictJSONError(f"holds {text[:40]}, which overflows a float")
    return x


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise StrictJSONError(f"holds a {len(text.lstrip('-')):,}-digit integer (at most {MAX_INT_DIGITS})")
    return int(text)


def strict_json(text: str | bytes) -> Any:
    """`json.loads`, refusing duplicate keys, NaN / Infinity (and floats that overflow to them) and integers of
    more than `MAX_INT_DIGITS` digits (StrictJSONError, a ValueError, its message without a location)."""
    return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float, parse_int=_int)


def loads_json(text: str | bytes, where: str, what: str, *, error: type[Exception] = DepthlensError) -> Any:
    """Parsed JSON; `error` (one line) for invalid JSON, a duplicate key, NaN or Infinity, an integer too long,
    nesting too deep for the parser, or no memory."""
    try:
        return strict_json(text)
    except StrictJSONError as e:
        raise error(f"{where}: {what} {e}") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise error(f"{where}: {what} is not valid UTF-8 (byte {e.start})") from None
    except RecursionError:
        raise error(f"{where}: {what} is nested too deeply to be a depthlens input") from None
    except MemoryError:
        raise error(f"{where}: out of memory parsing {what}") from None
    except ValueError as e:  # what else int()/float() refuse
        raise error(f"{where}: {what} is not valid JSON ({e})") from None


def read_json(
    path: str | os.PathLike[str],
    what: str,
    *,
    max_bytes: int = CONFIG_MAX,
    error: type[Exception] = DepthlensError,
    object_only: bool = True,
    allow_stdin: bool = False,
) -> Any:
    """A JSON file (a JSON object unless `object_only=False`), through `read_bytes` and `loads_json`."""
    data = read_bytes(path, what, max_bytes=max_bytes, error=error, allow_stdin=allow_stdin)
    value = loads_json(data, str(path), what, error=error)
    if object_only and not isinstance(value, dict):
        raise error(f"{path}: {what} must be a JSON object, got {type(value).__name__}")
    return value

"""Atomic file output: write next to the target, then rename, so no reader ever sees a partial file."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator

from ..errors import DepthlensError


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden temp path in the target's directory (same filesystem, so `os.replace` is atomic);
    on success it replaces `path`, on any failure it is removed. OSErrors become one-line DepthlensErrors."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise DepthlensError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)  # no-op after a successful replace


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> Path:
    """Write `data` to `path` atomically (optionally fsync'ed before the rename)."""
    with atomic_target(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))

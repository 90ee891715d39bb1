"""Temp names and signal-safe cleanup, the layer under every atomic writer of `atomic.py`: the hidden temp
name of an output (`.NAME.tmp-HOST-PID-RANDOM`, shortened with a hash to fit the filesystem's name limit), the
guard that removes this process's temps on SIGTERM/SIGHUP, the removal of temps left by killed writers, the
repair of an interrupted directory swap (`recover`), and the parent directories a failed write removes again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import DepthlensError

_HOST = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
_LIVE: set[Path] = set()  # temps of this process not yet renamed into place
_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
_depth = 0
# what `signal.getsignal` returns (typeshed's private `signal._HANDLER`)
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
_previous: dict[int, _Handler] = {}
_lock = threading.Lock()


# -------------------------------------------------------------------------------------------------
# temp names and signal-safe cleanup


def name_max(directory: Path) -> int:
    """The longest file name (bytes) the filesystem of `directory` (or its nearest existing ancestor) allows."""
    d = directory
    while not d.exists() and d != d.parent:
        d = d.parent
    try:
        return int(os.pathconf(d, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def fit_name(name: str, room: int) -> str:
    """`name`, or when longer than `room` bytes a prefix of it plus a hash of the whole (so two long names
    that share a prefix still get different temps)."""
    raw = os.fsencode(name)
    if len(raw) <= room:
        return name
    tag = "~" + hashlib.sha256(raw).hexdigest()[:12]
    head = raw[: max(1, room - len(tag))]
    return os.fsdecode(head).encode("utf-8", "ignore").decode("utf-8", "ignore") + tag


def _temp_prefix(path: Path) -> str:
    # `.NAME.tmp-HOST-` + PID (<= 10) + `-` + 8 hex: the name part is shortened to keep the whole <= NAME_MAX
    room = name_max(path.parent) - len(os.fsencode(f"..tmp-{_HOST}-")) - 10 - 1 - 8
    return f".{fit_name(path.name, max(16, room))}.tmp-{_HOST}-"


def temp_name(path: Path) -> Path:
    return path.parent / f"{_temp_prefix(path)}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Remove this process's temps, then let the signal act as it would have without us."""
    for p in list(_LIVE):
        _remove(p)
    _LIVE.clear()
    prev = _previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL if prev in (None, signal.SIG_DFL) else prev)
    if prev != signal.SIG_IGN:
        os.kill(os.getpid(), signum)


def _forget_after_fork() -> None:
    """A forked child (e.g. a figure worker of `studies.write`) owns none of its parent's temps: a signal that ends
    it must not remove the directory its parent is still writing."""
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@contextlib.contextmanager
def _guard(tmp: Path) -> Iterator[None]:
    """Register `tmp` for removal on SIGTERM/SIGHUP while the block runs (handlers only in the main thread)."""
    global _depth
    main = threading.current_thread() is threading.main_thread()
    with _lock:
        _LIVE.add(tmp)
        if main:
            if _depth == 0:
                for s in _SIGNALS:
                    _previous[s] = signal.getsignal(s)
                    signal.signal(s, _on_signal)
            _depth += 1
    try:
        yield
    finally:
        with _lock:
            _LIVE.discard(tmp)
            if main:
                _depth -= 1
                if _depth == 0:
                    for s in _SIGNALS:
                        signal.signal(s, _previous.pop(s, signal.SIG_DFL))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back for a few renames (they are delivered right after)."""
    sigs = {signal.SIGINT, *_SIGNALS}
    can = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs) if can else None
    try:
        yield
    finally:
        if old is not None:  # `can`: pthread_sigmask returns a set
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temps(path: Path) -> list[Path]:
    """Temps for `path` left by dead processes of this host (a SIGKILL during a write)."""
    out = []
    prefix = _temp_prefix(path)
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            if p.name.startswith(prefix):
                pid = p.name[len(prefix) :].split("-")[0]
                if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                    out.append(p)
    return out


def recover(path: str | os.PathLike[str]) -> str | None:
    """Repair what a kill left next to `path`; return a one-line note of what was done (None if nothing).

    `.NAME.new` is always complete; `.NAME.old` is the copy being replaced. Killed ... before the first
    rename: `NAME` (old) and `.NAME.new` -> finish the swap; between the renames: only the two hidden
    copies -> `.NAME.new` becomes `NAME`; after the second: `NAME` and `.NAME.old` -> drop `.NAME.old`."""
    path = Path(path)
    new, old = _hidden(path, "new"), _hidden(path, "old")
    notes = []
    for p in stale_temps(path):
        _remove(p)
        notes.append(f"removed {p.name} left by a killed writer")
    try:
        if new.exists():
            if path.exists() or path.is_symlink():
                _remove(old)
                os.replace(path, old)
            os.replace(new, path)
            notes.append(f"completed an interrupted replacement of {path} (newest complete copy kept)")
        elif old.exists() and not path.exists():
            os.replace(old, path)
            notes.append(f"restored {path} from {old.name} (an interrupted replacement)")
        if old.exists():
            _remove(old)
    except OSError as e:
        raise DepthlensError(
            f"{path}: an interrupted replacement left {new.name}/{old.name} and could not be "
            f"repaired ({e.strerror or e}); fix by hand"
        ) from e
    return "; ".join(notes) or None


def _hidden(path: Path, what: str) -> Path:
    room = name_max(path.parent) - len(os.fsencode(f"..{what}"))
    return path.parent / f".{fit_name(path.name, room)}.{what}"


def _missing_parents(path: Path) -> list[Path]:
    out, anc = [], path.parent
    while not anc.exists() and anc != anc.parent:
        out.append(anc)
        anc = anc.parent
    return out


@contextlib.contextmanager
def parents_made(path: Path) -> Iterator[None]:
    """Create the missing parent directories of `path`; remove those this call created if the block fails."""
    created = _missing_parents(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for d in created:  # innermost first
            try:
                d.rmdir()
            except OSError:
                break
        raise

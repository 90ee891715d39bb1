"""Atomic output: every depthlens writer goes through here, so no reader ever sees a partial file, a kill
leaves nothing behind that the next run cannot explain, and nothing is deleted that we did not create.

    with atomic_target("x.nc") as tmp:        # one file: written to a hidden temp name, then renamed
        ds.to_netcdf(tmp)
    with atomic_dir("ckpt", kind="checkpoint", overwrite=True) as tmp:   # a directory: built, then swapped in
        (tmp / "config.json").write_text(...)

Temp names are `.NAME.tmp-HOST-PID-RANDOM`. They are removed on an exception, on SIGINT (KeyboardInterrupt),
and on SIGTERM/SIGHUP (what `timeout`, `kill` and Slurm send): a handler removes this process's temps, then
lets the signal do what it would have done. A SIGKILL cannot be caught: the next writer of the same name
removes temps of dead processes on this host.

Replacing a directory takes two renames (`NAME` -> `.NAME.old`, then `.NAME.new` -> `NAME`); signals are held
off between them, and a kill there (SIGKILL, power loss) is repaired by `recover()` on the next run, which
always keeps the newest complete copy (`.NAME.new` is complete by construction: it is renamed from the temp
only after everything in it was written).

Files and directories are created with the normal umask permissions (no mkstemp 0600 / mkdtemp 0700).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DepthlensError

_HOST = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
_LIVE: set[Path] = set()  # temps of this process not yet renamed into place
_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
_depth = 0
_previous: dict[int, object] = {}
_lock = threading.Lock()


# -------------------------------------------------------------------------------------------------
# temp names and signal-safe cleanup


def temp_name(path: Path) -> Path:
    return path.parent / f".{path.name}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


def _on_signal(signum: int, frame: object) -> None:
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
                        signal.signal(s, _previous.pop(s, signal.SIG_DFL))  # type: ignore[arg-type]


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back for a few renames (they are delivered right after)."""
    sigs = {signal.SIGINT, *_SIGNALS}
    can = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs) if can else None
    try:
        yield
    finally:
        if can:
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
    prefix = f".{path.name}.tmp-{_HOST}-"
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            if p.name.startswith(prefix):
                pid = p.name[len(prefix):].split("-")[0]
                if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                    out.append(p)
    return out


def recover(path: str | os.PathLike) -> str | None:
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
        raise DepthlensError(f"{path}: an interrupted replacement left {new.name}/{old.name} and could not be "
                             f"repaired ({e.strerror or e}); fix by hand") from e
    return "; ".join(notes) or None


def _hidden(path: Path, what: str) -> Path:
    return path.parent / f".{path.name}.{what}"


# -------------------------------------------------------------------------------------------------
# what may be replaced


def recognise(path: str | os.PathLike) -> str | None:
    """What depthlens output `path` is ("checkpoint", "resume state", "report", "dataset", "netCDF dataset",
    "figure", "text"), or None when it is not recognisably ours (then --overwrite will not touch it)."""
    path = Path(path)
    if path.is_symlink() or not path.exists():
        return None
    if path.is_dir():
        if (path / "state.json").is_file() and (path / "state.safetensors").is_file():
            return "resume state"
        if isinstance(_json(path / "depthlens_export.json"), dict):  # adapters.convert.export_llama
            return "converted checkpoint"
        cfg = _json(path / "config.json")
        if isinstance(cfg, dict) and "depthlens_version" in cfg:
            return "checkpoint"
        man = _json(path / "manifest.json")
        if isinstance(man, dict) and (path / "index.html").is_file() and "checkpoints" in man:
            return "report"
        if isinstance(man, dict) and ("shards" in man or "data_hash" in man):
            return "dataset"
        return None
    if not path.is_file():
        return None
    head = _head(path, 8)
    if path.suffix == ".nc" and head.startswith(b"\x89HDF\r\n\x1a\n") and _nc_is_ours(path):
        return "netCDF dataset"
    if path.suffix in (".png", ".svg", ".pdf") and b"depthlens" in _head(path, 4096) + _tail(path, 4096):
        return "figure"
    return None


def _json(p: Path) -> object:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _head(p: Path, n: int) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _tail(p: Path, n: int) -> bytes:
    try:
        with open(p, "rb") as f:
            f.seek(max(0, p.stat().st_size - n))
            return f.read(n)
    except OSError:
        return b""


def _nc_is_ours(path: Path) -> bool:
    try:
        import netCDF4

        with netCDF4.Dataset(path) as ds:
            return str(getattr(ds, "source", "")).startswith("depthlens")  # written by analysis.dataset
    except Exception:  # noqa: BLE001 - unreadable means "not recognisably ours"
        return False


def check_target(path: str | os.PathLike, overwrite: bool, *, kinds: tuple[str, ...] | None = None,
                 flag: str = "--overwrite") -> Path:
    """Refuse (DepthlensError, one line) to write `path` when it exists and may not be replaced: without
    `overwrite`, or when it is not recognisably depthlens output of one of `kinds`. Repairs an interrupted
    swap first. Returns `path`."""
    path = Path(path)
    recover(path)
    if not (path.exists() or path.is_symlink()):
        if not path.parent.is_dir():
            raise DepthlensError(f"cannot write {path}: directory {path.parent} does not exist")
        return path
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return path  # an empty directory: nothing to lose
    if not overwrite:
        raise DepthlensError(f"{path}: already exists (pass {flag} to replace it)")
    kind = recognise(path)
    if kind is None or (kinds is not None and kind not in kinds):
        what = f"a {kind}" if kind else "not recognisably depthlens output"
        raise DepthlensError(f"{path}: {what}; {flag} replaces only depthlens "
                             f"{' / '.join(kinds) if kinds else 'output'}, refusing to delete it")
    return path


# -------------------------------------------------------------------------------------------------
# writers


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden temp path next to `path` (same filesystem, so `os.replace` is atomic); on success it
    replaces `path`, on an exception or SIGTERM it is removed. OSErrors become one-line DepthlensErrors."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with _guard(tmp):
            yield tmp
            follow_umask(tmp)
            os.replace(tmp, path)
    except OSError as e:
        raise DepthlensError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # no-op after a successful replace


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False, kinds: tuple[str, ...] | None = None,
               flag: str = "--overwrite", checked: bool = False) -> Iterator[Path]:
    """Yield a fresh temp directory next to `path`; on success swap it in as `path` (replacing a previous
    depthlens output of one of `kinds` only when `overwrite`). On failure the temp is removed; so are parent
    directories this call created."""
    path = Path(path)
    created = _missing_parents(path)
    tmp = temp_name(path)
    try:
        if not checked:
            path.parent.mkdir(parents=True, exist_ok=True)
            check_target(path, overwrite, kinds=kinds, flag=flag)
        with _guard(tmp):
            tmp.mkdir()  # umask permissions (mkdtemp would make it 0700)
            try:
                yield tmp
                swap_in(tmp, path)
            except BaseException:
                _remove(tmp)
                raise
        created = []
    except OSError as e:
        raise DepthlensError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        for d in created:  # parents this call created, innermost first
            try:
                d.rmdir()
            except OSError:
                break


def follow_umask(path: Path) -> None:
    """Give `path` (and, for a directory, everything in it) the permissions a plain open()/mkdir() would:
    some writers (safetensors, mkstemp) create 0600 files regardless of the umask."""
    mask = os.umask(0)
    os.umask(mask)
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def swap_in(tmp: Path, path: Path) -> None:
    """Make the complete directory `tmp` the new `path` (see the module doc for the protocol)."""
    new, old = _hidden(path, "new"), _hidden(path, "old")
    follow_umask(tmp)
    with _signals_held():
        _remove(new)
        os.replace(tmp, new)  # from here on the new copy is complete and recoverable
        if path.exists() or path.is_symlink():
            _remove(old)
            os.replace(path, old)
        os.replace(new, path)
    _remove(old)


def _missing_parents(path: Path) -> list[Path]:
    out, anc = [], path.parent
    while not anc.exists() and anc != anc.parent:
        out.append(anc)
        anc = anc.parent
    return out


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> Path:
    """Write `data` to `path` atomically (optionally fsync'ed before the rename)."""
    with atomic_target(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_with(path: str | os.PathLike, writer: Callable[[Path], object]) -> Path:
    """`writer(tmp)` writes the file; it lands at `path` atomically."""
    with atomic_target(path) as tmp:
        writer(tmp)
    return Path(path)

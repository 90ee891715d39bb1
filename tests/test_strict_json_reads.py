"""Every JSON depthlens reads from a file a user can hand it goes through the strict reader (issue 35): the reads
the bad-input matrix cannot reach by a command line. An ownership marker with a key twice marks nothing (which
"kind" is meant?); a netCDF file's list of boolean attrs that is not strict JSON is refused naming the file; a GGUF
cache entry whose entry.json has a key twice is damaged (rebuilt, never trusted), and one that is a list is
listed as damaged, not a traceback; a report summary with a key twice is refused naming the file. Each test also
checks the well-formed twin is accepted, so the refusal is the duplicate's, not the reader's."""

from __future__ import annotations

import json

import pytest

from depthlens.errors import DepthlensError


def test_an_ownership_marker_with_a_key_twice_marks_nothing(tmp_path):
    from depthlens.io.ownership import MARKER, MARKER_FORMAT, read_marker, recognise

    good, forged = tmp_path / "good", tmp_path / "forged"
    for d in (good, forged):
        d.mkdir()
    (good / MARKER).write_text(json.dumps({"format": MARKER_FORMAT, "kind": "report"}))
    (forged / MARKER).write_text(f'{{"format": "{MARKER_FORMAT}", "kind": "checkpoint", "kind": "report"}}')
    assert recognise(good) == "report"
    assert read_marker(forged) is None and recognise(forged) is None  # --overwrite will not touch it


@pytest.mark.parametrize(
    ("attr", "needle"),
    [('["a", ', "is not valid JSON"), ("[NaN]", "holds NaN"), ('{"a": 1}', "a JSON list of attribute names")],
)
def test_a_netcdf_files_bool_attrs_are_read_strictly(tmp_path, attr, needle):
    import numpy as np
    import xarray as xr

    from depthlens.io.dataset import BOOL_ATTRS, read_netcdf

    ok = tmp_path / "ok.nc"
    xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"a": 1, BOOL_ATTRS: '["a"]'}).to_netcdf(ok, engine="netcdf4")
    assert read_netcdf(ok).attrs["a"] is True
    bad = tmp_path / "bad.nc"
    xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"a": 1, BOOL_ATTRS: attr}).to_netcdf(bad, engine="netcdf4")
    with pytest.raises(DepthlensError) as e:
        read_netcdf(bad)
    assert str(e.value).startswith(f"{bad}: attribute {BOOL_ATTRS!r}") and needle in str(e.value), e.value


def test_a_gguf_cache_entry_with_a_key_twice_is_damaged(tmp_path):
    from depthlens.adapters import gguf_cache as gc

    entry = tmp_path / "k1"
    entry.mkdir()
    (entry / "entry.json").write_text(f'{{"format": {gc.FORMAT}, "format": {gc.FORMAT}, "gguf_sha256": "x"}}')
    with pytest.raises(gc._Damaged, match="StrictJSONError"):
        gc._read(entry, "x", None)
    (entry / "entry.json").write_text(json.dumps({"format": gc.FORMAT, "gguf_sha256": "y"}))
    with pytest.raises(gc._Damaged, match="another file"):  # the well-formed entry gets past the parse
        gc._read(entry, "x", None)
    listed = tmp_path / "k2"
    listed.mkdir()
    (listed / "entry.json").write_text("[1, 2]")
    assert [e["gguf_name"] for e in gc.entries(tmp_path)] == ["(damaged)", "(damaged)"]


def test_a_report_summary_with_a_key_twice_is_refused(tmp_path):
    from depthlens.studies.claims import runs_from_report

    (tmp_path / "summary.json").write_text('[{"checkpoint": "a", "checkpoint": "b", "design": "preln", "n_layer": 4}]')
    with pytest.raises(DepthlensError, match="'checkpoint' twice") as e:
        runs_from_report(tmp_path)
    assert str(tmp_path / "summary.json") in str(e.value)
    (tmp_path / "summary.json").write_text('{"checkpoint": "a"}')
    with pytest.raises(DepthlensError, match="JSON list of records"):
        runs_from_report(tmp_path)
    (tmp_path / "summary.json").write_text('[{"checkpoint": "a", "design": "preln", "n_layer": 4}]')
    assert runs_from_report(tmp_path) == {}  # well-formed, no datasets: nothing to merge


def test_a_hugging_face_tokenizer_file_with_a_key_twice_is_refused(tmp_path):
    """transformers reads tokenizer_config.json and friends with json.load (the last of two keys wins):
    depthlens reads them strictly first, naming the file."""
    from depthlens.adapters.tokenizer import load_hf_tokenizer
    from depthlens.errors import CheckpointError
    from test_adapters import _tokenizer

    _tokenizer(tmp_path, bos=True)
    assert load_hf_tokenizer(tmp_path).bos_id == 0  # the well-formed files load
    cfg = tmp_path / "tokenizer_config.json"
    text = cfg.read_text()
    cfg.write_text(text.replace('"bos_token": "<s>"', '"bos_token": "<s>", "bos_token": "</s>"', 1))
    assert cfg.read_text() != text
    with pytest.raises(CheckpointError, match="'bos_token' twice") as e:
        load_hf_tokenizer(tmp_path)
    assert str(cfg) in str(e.value)
    cfg.write_text(text)
    (tmp_path / "special_tokens_map.json").write_text('{"unk_token": "<unk>", "x": NaN}')
    with pytest.raises(CheckpointError, match="holds NaN"):
        load_hf_tokenizer(tmp_path)

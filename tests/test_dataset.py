"""Dataset conventions, provenance hashing and atomic netCDF I/O."""

import hashlib
import json
import re

import numpy as np
import pytest
import xarray as xr

from depthlens.errors import CheckpointError, DepthlensError
from depthlens.io import dataset as D

L = 4


def _ds(seed=0, **provenance):
    rng = np.random.default_rng(seed)
    A = rng.random((L + 1, L + 1))
    A[np.add.outer(np.arange(L + 1), np.arange(L + 1)) > L] = np.nan  # invalid ℓ + n > L
    return D.make_dataset(
        {
            "angular_distance": (("state", "block_size"), A, {"long_name": "angular distance", "units": "1"}),
            "causal_score": (D.LAYER_DIMS, rng.random((L, L)), {"long_name": "causal score", "units": "1"}),
            "erank": (("layer", "site"), rng.random((L, 2)), {"long_name": "erank", "units": "1", "ok": True}),
        },
        {
            "layer": np.arange(L),
            "state": np.arange(L + 1),
            "block_size": np.arange(L + 1),
            "layer_other": np.arange(L),
            "site": ["attn", "mlp"],
            "checkpoint": "hc_l4",
        },
        metric="causal",
        options={"variant": "current", "threshold": 0.45, "exclude_bos": True, "thetas": [0.1, 0.2], "skip": None},
        provenance={"design": "hc", "config": {"n_layer": L, "hc": {"n": 4}}, "seed": seed, **provenance},
        command="depthlens causal ckpt/hc_l4",
    )


def test_make_dataset_attrs():
    ds = _ds()
    a = ds.attrs
    assert a["Conventions"] == "CF-1.11" and a["title"] == "depthlens causal" and a["metric"] == "causal"
    assert re.fullmatch(r"depthlens \S+", a["source"])
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 depthlens causal ckpt/hc_l4$", a["history"])
    assert a["exclude_bos"] is True  # a real boolean (0/1 only in the file; read back as a boolean)
    assert json.loads(a["thetas_json"]) == [0.1, 0.2]
    assert json.loads(a["config_json"]) == {"n_layer": L, "hc": {"n": 4}}
    assert "skip" not in a and "config" not in a
    assert a["threshold"] == 0.45 and a["design"] == "hc"
    assert ds["erank"].attrs["ok"] == 1
    assert ds["causal_score"].dims == ("layer", "layer_other")


def test_make_dataset_requires_long_name_and_units():
    with pytest.raises(ValueError, match="units"):
        D.make_dataset({"x": (("layer",), np.zeros(3), {"long_name": "x"})}, metric="m", options={}, provenance={})
    with pytest.raises(ValueError, match="clashes"):
        D.make_dataset({}, metric="m", options={"title": "x"}, provenance={})


def test_netcdf_round_trip_identical(tmp_path):
    ds = _ds()
    path = D.write_netcdf(ds, tmp_path / "out.nc")
    back = D.read_netcdf(path)
    xr.testing.assert_identical(back, ds)
    assert back.attrs["history"] == ds.attrs["history"] and isinstance(back.attrs["variant"], str)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.nc"]  # no temp file left


def test_refuses_to_overwrite(tmp_path):
    path = tmp_path / "out.nc"
    D.write_netcdf(_ds(0), path)
    before = path.read_bytes()
    with pytest.raises(DepthlensError, match="already exists"):
        D.write_netcdf(_ds(1), path)
    assert path.read_bytes() == before
    D.write_netcdf(_ds(1), path, overwrite=True)
    assert D.read_netcdf(path).attrs["seed"] == 1


def test_unwritable_or_missing_locations(tmp_path):
    with pytest.raises(DepthlensError, match="does not exist"):
        D.write_netcdf(_ds(), tmp_path / "nope" / "out.nc")
    with pytest.raises(DepthlensError):
        D.read_netcdf(tmp_path / "missing.nc")
    (tmp_path / "junk.nc").write_text("not netcdf")
    with pytest.raises(DepthlensError, match="not a readable"):
        D.read_netcdf(tmp_path / "junk.nc")


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("boom")])
def test_no_partial_file_when_write_fails(tmp_path, monkeypatch, error):
    existing = tmp_path / "old.nc"
    D.write_netcdf(_ds(0), existing)
    before = existing.read_bytes()

    def half_write(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89HDF partial")  # the file exists and is truncated when the failure hits
        raise error

    monkeypatch.setattr(xr.Dataset, "to_netcdf", half_write)
    expected = DepthlensError if isinstance(error, OSError) else RuntimeError
    with pytest.raises(expected):
        D.write_netcdf(_ds(1), tmp_path / "new.nc")
    with pytest.raises(expected):
        D.write_netcdf(_ds(1), existing, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.nc"]
    assert existing.read_bytes() == before


def test_concat_checkpoints(tmp_path):
    a, b = _ds(0), _ds(1)
    D.write_netcdf(a, tmp_path / "a.nc")
    a = D.read_netcdf(tmp_path / "a.nc")  # mixed in-memory / read-back inputs
    both = D.concat_checkpoints([a, b], ["hc_l4_s0", "hc_l4_s1"])
    assert both["causal_score"].dims == ("checkpoint", "layer", "layer_other")
    assert both["checkpoint"].values.tolist() == ["hc_l4_s0", "hc_l4_s1"]
    np.testing.assert_array_equal(both["causal_score"].sel(checkpoint="hc_l4_s1").values, b["causal_score"].values)
    assert both["seed"].dims == ("checkpoint",) and both["seed"].values.tolist() == [0.0, 1.0]
    assert "seed" not in both.attrs and both.attrs["design"] == "hc" and both.attrs["Conventions"] == "CF-1.11"
    D.write_netcdf(both, tmp_path / "both.nc")
    xr.testing.assert_identical(D.read_netcdf(tmp_path / "both.nc"), both)
    with pytest.raises(ValueError):
        D.concat_checkpoints([a, b], ["x", "x"])


def _fake_checkpoint(root, weights=b"\x00weights" * 1000, config=None):
    root.mkdir()
    (root / "model.safetensors").write_bytes(weights)
    (root / "config.json").write_text(json.dumps(config or {"design": "hc", "n_layer": 4}))
    return root


def test_checkpoint_sha256(tmp_path):
    root = _fake_checkpoint(tmp_path / "ckpt")
    w, c = (root / "model.safetensors").read_bytes(), (root / "config.json").read_bytes()
    expected = hashlib.sha256(b"model.safetensors\0%d\0" % len(w) + w + b"config.json\0%d\0" % len(c) + c).hexdigest()
    assert D.checkpoint_sha256(root) == expected
    assert D.sha256_file(root / "config.json") == hashlib.sha256(c).hexdigest()
    other = _fake_checkpoint(tmp_path / "ckpt2", weights=b"\x01weights" * 1000)
    assert D.checkpoint_sha256(other) != expected
    (other / "config.json").unlink()
    with pytest.raises(CheckpointError):
        D.checkpoint_sha256(other)


def test_provenance_into_dataset(tmp_path):
    import torch

    root = _fake_checkpoint(tmp_path / "ckpt")
    tokens = torch.arange(12).reshape(3, 4)
    prov = D.provenance(root, design="hc", eval_data=tokens, n_tokens=12, seed=0, dtype=torch.bfloat16)
    assert prov["checkpoint_sha256"] == D.checkpoint_sha256(root)
    assert prov["config"] == {"design": "hc", "n_layer": 4}
    assert prov["dtype"] == "bfloat16" and prov["torch_version"] == torch.__version__
    assert prov["eval_data_sha256"] == D.data_sha256(tokens.clone()) != D.data_sha256(tokens.reshape(4, 3))
    ds = D.make_dataset({}, metric="angular", options={}, provenance=prov)
    assert json.loads(ds.attrs["config_json"]) == prov["config"]
    D.write_netcdf(ds, tmp_path / "p.nc")
    xr.testing.assert_identical(D.read_netcdf(tmp_path / "p.nc"), ds)

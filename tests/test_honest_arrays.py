"""Arrays that do not mislead: cells that are no measurement are NaN (C(s, t), t < s), every dimension has a
coordinate, every coordinate a long_name, booleans are booleans, and all of it survives the netCDF round trip;
files written before that read back the same way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.io.dataset import BOOL_ATTRS, read_netcdf, write_netcdf
from depthlens.models import ModelConfig, build_model
from depthlens.runtime.evaldata import EvalData

L = 4


@pytest.fixture(scope="module")
def ds():
    model = build_model(ModelConfig.debug("preln", n_layer=L), seed=0)
    toks = torch.randint(0, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    return causal_scores(model, EvalData.from_tokens(toks), variants=("current", "future"), direct=True)


def test_undefined_cells_are_nan_and_means_see_only_measurements(ds):
    below = np.tril(np.ones((L, L), bool), -1)
    for name in ("causal_score", "direct_score"):
        m = ds[name].values  # (variant, aggregator, s, t)
        assert np.isnan(m[..., below]).all() and np.isfinite(m[..., ~below]).all(), name
    for name in ("seq_max", "seq_sum", "seq_count", "seq_sq_change", "seq_sq_update"):
        assert np.isnan(ds[name].values[:, below, :]).all(), name
    C = ds["causal_score"].sel(variant="current", aggregator="max")
    # xarray's mean skips NaN: the mean of the matrix is the mean of its measured cells (t >= s), by hand
    assert float(C.mean()) == pytest.approx(float(np.mean(C.values[~below])))
    assert "NaN where t < s" in ds["causal_score"].attrs["description"]


def test_every_dimension_has_a_coordinate_and_every_coordinate_a_name(ds):
    assert set(ds.dims) <= set(ds.coords), set(ds.dims) - set(ds.coords)
    for name in ds.coords:
        assert ds[name].attrs.get("long_name"), name
    assert ds["eval_pos"].attrs["long_name"].startswith("token position")
    assert list(ds["eval_seq"].values) == [0, 1, 2]


def test_booleans_and_labels_survive_the_netcdf_round_trip(ds, tmp_path):
    assert ds.attrs["direct"] is True and ds.attrs["outputs"] is False
    back = read_netcdf(write_netcdf(ds, tmp_path / "c.nc"))
    assert back.attrs["direct"] is True and back.attrs["outputs"] is False and BOOL_ATTRS not in back.attrs
    with xr.open_dataset(tmp_path / "c.nc") as raw:  # in the file: 0/1 and the list of what was boolean
        assert raw.attrs["direct"] == 1 and "direct" in raw.attrs[BOOL_ATTRS]
    for name in ds.coords:
        assert back[name].attrs == ds[name].attrs, name
    for name in ds.data_vars:
        np.testing.assert_array_equal(back[name].values, ds[name].values)  # NaN where NaN
        assert back[name].attrs == ds[name].attrs, name


def test_a_file_from_before_nan_cells_reads_back_with_nan_cells(ds, tmp_path):
    old = ds.copy(deep=True)
    below = xr.DataArray(np.tril(np.ones((L, L), bool), -1), dims=("layer", "layer_other"))
    for name in ("causal_score", "direct_score", "seq_max", "seq_sum", "seq_sq_change"):
        old[name] = old[name].where(~below, 0.0)  # what the old writer stored
    old = old.drop_vars(["eval_seq", "eval_pos"])
    old.attrs = {k: (int(v) if isinstance(v, bool) else v) for k, v in old.attrs.items()}
    old.to_netcdf(tmp_path / "old.nc", engine="netcdf4")
    back = read_netcdf(tmp_path / "old.nc")
    for name in ("causal_score", "direct_score", "seq_max", "seq_sum", "seq_sq_change"):
        np.testing.assert_array_equal(back[name].values, ds[name].values)
    assert back.attrs["direct"] == 1  # an old file names no booleans: its 0/1 stay numbers


def test_the_bootstrap_matrix_is_nan_where_the_engine_matrix_is(ds):
    from depthlens.diagnostics.sweep import resampled_matrix

    for agg in ("max", "mean", "pooled"):
        m = resampled_matrix(ds, "causal", np.ones(3), aggregator=agg)
        ref = ds["causal_score"].sel(variant="current", aggregator=agg).values
        np.testing.assert_allclose(m, ref, rtol=1e-6)  # NaN in the same cells

"""Analysis over 2 gloo processes (torch.distributed, the env torchrun sets) equals the single-process dataset;
a failing rank fails the whole run and leaves no file."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import xarray as xr

from depthlens.analysis.causal import causal_scores
from depthlens.analysis.evaldata import random_eval_data
from depthlens.analysis.permutation import permutation_scores
from helpers import debug_model

torch.set_num_threads(1)


def _runs(fail_rank: int | None = None) -> dict:
    model = debug_model("preln", 4)
    data = random_eval_data(model.config.vocab_size, n_seq=4, seq_len=16, seed=0, bos_id=0)
    if fail_rank is not None and int(os.environ["RANK"]) == fail_rank:
        raise RuntimeError("rank failed on purpose")
    return {
        # few sequence batches (1): the skipped layers / pairs split over ranks
        "causal_arms": causal_scores(model, data, variants=("current", "future"), n_cuts=2, seq_batch=4),
        "perm_arms": permutation_scores(model, data, pairs="all", seq_batch=4),
        # enough sequence batches (4): the sequences split over ranks
        "causal_seqs": causal_scores(model, data, variants=("current",), seq_batch=1, direct=True),
        "perm_seqs": permutation_scores(model, data, pairs="late", seq_batch=1),
    }


def _worker(rank: int, world: int, port: int, out: str, fail_rank: int | None) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DEPTHLENS_DIST_TIMEOUT_MIN="2")
    torch.set_num_threads(1)
    results = _runs(fail_rank)
    if rank == 0:  # as the CLI does: only rank 0 writes
        for name, ds in results.items():
            ds.to_netcdf(Path(out) / f"{name}.nc")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single() -> dict:
    os.environ.pop("WORLD_SIZE", None)
    return _runs()


def test_two_processes_equal_one(tmp_path, single):
    mp.spawn(_worker, args=(2, _port(), str(tmp_path), None), nprocs=2, join=True)
    for name, ref in single.items():
        with xr.open_dataset(tmp_path / f"{name}.nc") as got:
            got = got.load()
        ref = xr.Dataset.from_dict(ref.to_dict())  # the netCDF round trip of the reference, for a like-for-like compare
        for var in ref.data_vars:
            xr.testing.assert_allclose(got[var], ref[var], rtol=1e-6, atol=1e-7)
        assert got.attrs["batch_size"] == ref.attrs["batch_size"] and got.attrs["seq_batch"] == ref.attrs["seq_batch"]


def test_failing_rank_fails_the_run_and_writes_nothing(tmp_path):
    with pytest.raises(Exception, match="failed on purpose"):
        mp.spawn(_worker, args=(2, _port(), str(tmp_path), 1), nprocs=2, join=True)
    assert list(tmp_path.iterdir()) == []

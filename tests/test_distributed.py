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

from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.runtime.evaldata import random_eval_data
from helpers import debug_model


def _runs(fail_rank: int | None = None, inside: bool = False) -> dict:
    model = debug_model("preln", 4)
    data = random_eval_data(model.config.vocab_size, n_seq=4, seq_len=16, seed=0, bos_id=0)
    if fail_rank is not None and int(os.environ["RANK"]) == fail_rank:
        if not inside:
            raise RuntimeError("rank failed on purpose")

        def broken(*a, **k):  # this rank's model fails mid-run, inside the engine; the other rank is fine
            raise RuntimeError("layer failed on purpose")

        model.run_layers = broken
    return {
        # few sequence batches (1): the skipped layers / pairs split over ranks
        "causal_arms": causal_scores(model, data, variants=("current", "future"), n_cuts=2, seq_batch=4),
        "perm_arms": permutation_scores(model, data, pairs="all", seq_batch=4),
        # enough sequence batches (4): the sequences split over ranks
        "causal_seqs": causal_scores(model, data, variants=("current",), seq_batch=1, direct=True),
        "perm_seqs": permutation_scores(model, data, pairs="late", seq_batch=1),
    }


def _worker(rank: int, world: int, port: int, out: str, fail_rank: int | None, inside: bool = False) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DEPTHLENS_DIST_TIMEOUT_MIN="2",
    )
    torch.set_num_threads(1)
    if inside:  # every rank reports what it raised, so the test sees rank 0's error too
        try:
            _runs(fail_rank, inside=True)
        except Exception as e:  # noqa: BLE001
            (Path(out) / f"rank{rank}.err").write_text(f"{type(e).__name__}: {e}")
        return
    results = _runs(fail_rank)
    if rank == 0:  # as the CLI does: only rank 0 writes, through the writer that encodes bool attrs
        from depthlens.io.dataset import write_netcdf

        for name, ds in results.items():
            write_netcdf(ds, Path(out) / f"{name}.nc")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single() -> dict:
    os.environ.pop("WORLD_SIZE", None)
    return _runs()


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path, single):
    mp.spawn(_worker, args=(2, _port(), str(tmp_path), None), nprocs=2, join=True)
    for name, ref in single.items():
        with xr.open_dataset(tmp_path / f"{name}.nc") as got:
            got = got.load()
        ref = xr.Dataset.from_dict(ref.to_dict())  # the netCDF round trip of the reference, for a like-for-like compare
        for var in ref.data_vars:
            xr.testing.assert_allclose(got[var], ref[var], rtol=1e-6, atol=1e-7)
        assert got.attrs["batch_size"] == ref.attrs["batch_size"] and got.attrs["seq_batch"] == ref.attrs["seq_batch"]


@pytest.mark.slow
def test_failing_rank_fails_the_run_and_writes_nothing(tmp_path):
    with pytest.raises(Exception, match="failed on purpose"):
        mp.spawn(_worker, args=(2, _port(), str(tmp_path), 1), nprocs=2, join=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_rank_failing_inside_the_engine_fails_every_rank_with_its_line(tmp_path):
    """Rank 1's model breaks mid-run: rank 0 does not wait in the merge; it raises RankFailed naming rank 1 and
    its error (the line the CLI prints), and rank 1 raises its own error."""
    mp.spawn(_worker, args=(2, _port(), str(tmp_path), 1, True), nprocs=2, join=True)
    assert (tmp_path / "rank1.err").read_text() == "RuntimeError: layer failed on purpose"
    assert (tmp_path / "rank0.err").read_text() == "RankFailed: rank 1: RuntimeError: layer failed on purpose"

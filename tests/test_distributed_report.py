"""`report` under torchrun: 2 gloo processes write the report 1 process writes; a failing rank fails the run
with one line and leaves no directory; only rank 0 speaks.

Fields that legitimately differ between the two runs and are ignored (nothing else is):
- summary.json: `seconds` of every record (wall time);
- manifest.json: `created`, `command` (its --out differs), `world_size`, `seconds`, `checkpoints[*].seconds`;
- netCDF files: `created` and `history` (timestamp and command line; attributes, or per-checkpoint coordinates
  when the checkpoints were computed in different seconds);
- README.md / index.html: numbers followed by " s" (timings) and the footer line (timings, command line).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import xarray as xr
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from helpers import FAST_BOOT

ROOT = Path(__file__).resolve().parents[1]
# preln: every diagnostic but rank/attnres; hc: rank; full_attnres: attnres (and a second dataset shape)
CKPTS = [str(ROOT / "checkpoints" / n) for n in ("preln_l4", "hc_l4", "full_attnres_l4")]
# FAST_BOOT, not FAST: two ranks split the sequences and the bootstrap, so both need some of each
TEXT = "It was the best of times, it was the worst of times; def f(x):\n    return x * 2 + 1\n" * 40


def _torchrun(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node 2 -m depthlens.cli ARGS` with this tree first on the path."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "DEPTHLENS_DIST_TIMEOUT_MIN": "2",
    }
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "depthlens.cli",
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("depthlens: error:")]


def _masked(text: str) -> str:
    """Timings ("1.3 s") masked; the footer line (timings and the command line) dropped."""
    return re.sub(r"\d+(\.\d+)? s\b", "# s", "\n".join(l for l in text.splitlines() if "timings:" not in l))


@pytest.mark.slow
def test_two_ranks_write_the_report_one_process_writes(text, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    r = CliRunner().invoke(app, ["report", *CKPTS, "--out", str(one), "--data", str(text), *FAST_BOOT])
    assert r.exit_code == 0, r.output
    p = _torchrun(["report", *CKPTS, "--out", str(two), "--data", str(text), *FAST_BOOT, "--json"])
    assert p.returncode == 0, p.stderr
    assert not _error_lines(p.stderr)

    # summary.json, and --json printed once (by rank 0 only: stdout is one JSON document)
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert json.loads(p.stdout) == s2
    assert [r["checkpoint"] for r in s1] == ["preln_l4", "hc_l4", "full_attnres_l4"]
    assert [{**r, "seconds": None} for r in s1] == [{**r, "seconds": None} for r in s2]

    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert (m1["world_size"], m2["world_size"]) == (1, 2)
    for m in (m1, m2):
        for k in ("created", "command", "world_size", "seconds"):  # created/seconds: in timings.json today
            m.pop(k, None)
        for c in m["checkpoints"]:
            c.pop("seconds", None)
    assert m1 == m2

    files = sorted(f.relative_to(one) for f in one.rglob("*") if f.is_file())
    assert files == sorted(f.relative_to(two) for f in two.rglob("*") if f.is_file())
    assert {"rank.nc", "attnres.nc", "causal.nc", "permutation.nc"} <= {str(f) for f in files}
    for f in files:
        if f.suffix == ".nc":
            # when checkpoints were computed in different seconds, the merge keeps `created`/`history` as
            # per-checkpoint coordinates instead of one attribute (so does a long single-process run)
            a, b = (xr.load_dataset(d / f).drop_vars(["created", "history"], errors="ignore") for d in (one, two))
            for ds in (a, b):
                ds.attrs.pop("created", None)
                ds.attrs.pop("history", None)
            xr.testing.assert_identical(a, b)  # every value, coordinate and attribute: 0 tolerance
        elif f.suffix == ".png":
            assert (one / f).read_bytes() == (two / f).read_bytes(), f  # drawn from the same numbers
        elif f.suffix in (".md", ".html"):
            assert _masked((one / f).read_text()) == _masked((two / f).read_text()), f


@pytest.mark.slow
def test_a_failing_rank_fails_the_run_with_one_line_and_no_directory(text, tmp_path):
    broken = tmp_path / "broken"  # smaller than preln_l4: rank 0 takes preln_l4, rank 1 this one
    broken.mkdir()
    for f in Path(CKPTS[0]).iterdir():
        (broken / f.name).write_bytes(f.read_bytes()[:1000] if f.suffix == ".safetensors" else f.read_bytes())
    out = tmp_path / "rep"
    p = _torchrun(["report", CKPTS[0], str(broken), "--out", str(out), "--data", str(text), *FAST_BOOT])
    assert p.returncode != 0
    lines = _error_lines(p.stderr)
    assert len(lines) == 1 and lines[0].startswith("depthlens: error: rank 1: ") and "safetensors" in lines[0], p.stderr
    # no traceback through our code (torchrun adds its own summary); judged by the package's own folder, not by
    # the word "depthlens/", which a checkout in a folder named depthlens has in every path (its venv's too)
    assert str(Path(depthlens.__file__).resolve().parent) + os.sep not in p.stderr
    assert p.stdout == ""
    assert sorted(tmp_path.iterdir()) == [broken]  # no report, no temp directory


def _compute_fails_on_rank_1(rank: int, world: int, port: int, args: tuple) -> None:
    """A diagnostic raises on rank 1 only, after loading: rank 0 must learn it and stop, not wait."""
    ckpts, out, data, log = args
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DEPTHLENS_DIST_TIMEOUT_MIN="2",
    )
    torch.set_num_threads(1)
    from depthlens.diagnostics import registry
    from depthlens.studies.report import ReportOptions, build_report

    real = registry.run

    def run(name, *a, **kw):
        if rank == 1 and name == "angular":
            raise RuntimeError("diagnostic failed on purpose")
        return real(name, *a, **kw)

    registry.run = run
    opts = ReportOptions(data=data, n_seq=4, seq_len=16, n_boot=0, metrics=("angular", "mixing"))
    try:
        build_report(ckpts, out, opts)
        result = "ok"
    except Exception as err:  # noqa: BLE001  (recorded for the test)
        result = f"{type(err).__name__}: {err}"
    Path(log, f"rank{rank}.txt").write_text(result)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_an_exception_in_a_diagnostic_on_one_rank_stops_every_rank(text, tmp_path):
    out = tmp_path / "rep"
    mp.spawn(
        _compute_fails_on_rank_1,
        args=(2, _port(), (CKPTS[:2], str(out), str(text), str(tmp_path))),
        nprocs=2,
        join=True,
    )
    assert (tmp_path / "rank1.txt").read_text() == "RuntimeError: diagnostic failed on purpose"
    assert (tmp_path / "rank0.txt").read_text() == "RankFailed: rank 1: RuntimeError: diagnostic failed on purpose"
    assert not out.exists()


@pytest.mark.parametrize("rank,printed", [("0", 1), ("1", 0)])
def test_errors_before_any_work_are_printed_by_rank_0_only(rank, printed, tmp_path):
    env = {"WORLD_SIZE": "2", "RANK": rank}  # the same argv fails on every rank: one voice is enough
    for args, code in ((["--metrics", "causal,bogus"], 2), (["--n-seq", "0"], 2)):
        r = CliRunner(env=env).invoke(app, ["report", CKPTS[0], "--out", str(tmp_path / "o"), *args])
        assert r.exit_code == code and len(_error_lines(r.stderr)) == printed, r.stderr


def test_local_only_hides_the_world_from_the_engines(monkeypatch):
    from depthlens.runtime import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")  # no group is started: inside local_only world() never looks
    monkeypatch.setenv("RANK", "1")
    with distributed.local_only():
        assert distributed.world() == (0, 1)
        assert distributed.merge({"a": torch.ones(2).numpy()}, {"a": "sum"})["a"].tolist() == [1.0, 1.0]
    assert not distributed.is_main()  # still rank 1 for printing and writing


def test_assignment_balances_estimated_cost():
    from depthlens.runtime.ranks import assign, cost

    paths = [ROOT / "checkpoints" / n for n in ("preln_l4", "preln_l8", "preln_l16", "preln_l32", "hc_l16")]
    c = [cost(p) for p in paths]
    for p, v in zip(paths, c):  # n_layer² × weight bytes, re-derived from config.json and the file size
        L = json.loads((p / "config.json").read_text())["model"]["n_layer"]
        assert v == L * L * (p / "model.safetensors").stat().st_size
    owner = assign(paths, 2)
    assert owner[3] == 0  # the largest (L = 32) goes first, to rank 0
    loads = [sum(v for v, r in zip(c, owner) if r == k) for k in range(2)]
    # greedy by hand: each checkpoint, largest first, to the rank with the smaller load so far
    expect, acc = [0] * len(paths), [0.0, 0.0]
    for i in sorted(range(len(paths)), key=lambda i: -c[i]):
        k = 0 if acc[0] <= acc[1] else 1
        expect[i], acc[k] = k, acc[k] + c[i]
    assert owner == expect and loads == acc
    by_cost = sorted(range(len(paths)), key=lambda i: -c[i])
    assert [assign(paths, 8)[i] for i in by_cost] == [0, 1, 2, 3, 4]  # more ranks than checkpoints: one each
    assert cost(ROOT / "no-such-checkpoint") == 0.0


def test_device_cuda_means_one_gpu_per_rank(monkeypatch):
    from depthlens.runtime.distributed import device_for_rank

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    for n_gpu, want in ((8, "cuda:3"), (2, "cuda:1"), (1, "cuda:0"), (0, "cuda")):  # 1: CUDA_VISIBLE_DEVICES per rank
        monkeypatch.setattr(torch.cuda, "device_count", lambda n=n_gpu: n)
        assert device_for_rank("cuda") == want
        assert device_for_rank("cuda:5") == "cuda:5" and device_for_rank("cpu") == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert device_for_rank("cuda") == "cuda"  # one process: as given


def test_a_dataset_travels_exactly(text):
    """pack/unpack (the trip to rank 0) keeps every value, coordinate, encoding and attribute type; a netCDF
    round trip would turn int attributes into numpy integers."""
    from depthlens.runtime.ranks import pack, unpack
    from depthlens.studies.report import Entry, ReportOptions, compute, load_entries, report_eval_data

    opts = ReportOptions(data=text, n_seq=2, seq_len=16, n_boot=0, metrics=("angular", "rank"))
    entries = load_entries(CKPTS[1:2])
    compute(entries, report_eval_data(entries, opts), opts)
    back = Entry(**unpack(pack(entries[0])))
    assert back.model is None and back.name == "hc_l4" and set(back.datasets) == {"angular", "rank"}
    for m, ds in entries[0].datasets.items():
        got = back.datasets[m]
        xr.testing.assert_identical(got, ds)
        assert {k: type(v) for k, v in got.attrs.items()} == {k: type(v) for k, v in ds.attrs.items()}
        assert all(got[k].encoding == ds[k].encoding for k in ds.variables)

"""The docs run's warm `depthlens` (tests/warm_cli.py) answers as the real entry point does: the same stdout,
stderr, exit status and written file, for a success, a bad input (exit 1) and a usage error (exit 2); and a
command whose environment differs from the server's runs the real entry point instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warm_cli import served_cpu_seconds, warm_depthlens

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # the warm server serves the docs run, which is slow too; a server per worker costs ~4 s


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "COLUMNS": "100",
    }


def _bash(cmd: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warm")
    with warm_depthlens(_env(), ROOT, tmp / "shim") as env:
        yield env, tmp


@pytest.mark.parametrize(
    "args",
    [
        "info checkpoints/hc_l4",
        "causal checkpoints/preln_l4 --n-seq 4 --quiet --out {tmp}/{side}.nc",
        "causal checkpoints/no_such_checkpoint",
        "causal checkpoints/preln_l4 --no-such-option",
        "causal checkpoints/preln_l4 --threshold nan",
    ],
    ids=["success", "writes-a-dataset", "bad-input", "usage-error", "out-of-range"],
)
def test_the_warm_command_answers_as_the_real_one(warm, args):
    env, tmp = warm
    cold = _bash("depthlens " + args.format(tmp=tmp, side="cold"), _env(), ROOT)
    hot = _bash("depthlens " + args.format(tmp=tmp, side="warm"), env, ROOT)
    assert (hot.returncode, hot.stdout, hot.stderr) == (
        cold.returncode,
        cold.stdout.replace("cold", "warm"),
        cold.stderr,
    )
    served = [json.loads(line) for line in Path(env["DEPTHLENS_WARM_SOCKET"] + ".log").read_text().splitlines()]
    assert args.format(tmp=tmp, side="warm").split() in served  # it did run warm
    # each served command recorded its own CPU seconds (DEPTHLENS_DOCS_TIMINGS sums them): one line per command
    cpu = Path(env["DEPTHLENS_WARM_SOCKET"] + ".cpu").read_text().split()
    assert len(cpu) == len(served) and all(float(c) >= 0 for c in cpu) and served_cpu_seconds(env) > 0
    if "{side}" in args:
        import xarray as xr

        a, b = xr.load_dataset(tmp / "cold.nc"), xr.load_dataset(tmp / "warm.nc")
        xr.testing.assert_identical(a.drop_attrs(), b.drop_attrs())
        assert set(a.attrs) == set(b.attrs)


def test_another_environment_runs_the_real_entry_point(warm):
    env, _ = warm
    p = _bash("DEPTHLENS_SOMETHING=1 depthlens info checkpoints/hc_l4 | head -1", env, ROOT)
    assert p.returncode == 0 and "hc_l4" in p.stdout
    served = Path(env["DEPTHLENS_WARM_SOCKET"] + ".log").read_text()
    assert "DEPTHLENS_SOMETHING" not in served and served.count("hc_l4") <= 1  # only the warm test's own `info`

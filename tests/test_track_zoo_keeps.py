"""scripts/track-zoo.sh does not replace a track of runs whose snapshots are not on this machine with a track of
fewer runs (the main job's last step would otherwise drop what the committed reports/track shows): it keeps it and
says so; TRACK_PARTIAL=1, or snapshots of every tracked run, replace it. Run with a stand-in `depthlens` that
records what the script asks of it, beside the real interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, runs_with_snapshots: list[str], **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    calls = tmp / "calls.txt"
    stub = bin_ / "depthlens"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')  # `track RUN --check` passes, `track ...` records
    stub.chmod(0o755)
    py = bin_ / "python"  # the script runs "${DEPTHLENS%/depthlens}/python": this venv's (a wrapper keeps it a venv)
    py.write_text(f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    runs = tmp / "runs"
    for name in runs_with_snapshots:
        snap = runs / name / "snapshots" / "step_16"
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "snapshot.json").write_text("{}")
    calls.write_text("")
    full = {
        **os.environ,
        "DEPTHLENS": str(stub),
        "RUNS": str(runs),
        "OUT": str(tmp / "track"),
        "SKIP_SETUP": "1",
        "JOBS": "1",
        **env,
    }
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "track-zoo.sh"), "preln_l32", "hc_l32"],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
    )
    return p, [ln for ln in calls.read_text().splitlines() if "--check" not in ln]


@pytest.mark.slow  # the whole script, three times
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_track_of_runs_without_snapshots_here_is_kept(tmp_path):
    out = tmp_path / "track"
    out.mkdir()
    ds = xr.Dataset({"x": ("run", np.zeros(2))}, coords={"run": ["preln_l32", "hc_l32"]}, attrs={"source": "depthlens"})
    ds.to_netcdf(out / "track.nc")  # a depthlens track of two runs (its `source` attribute says whose)

    p, tracked = _run(tmp_path, ["preln_l32"])
    assert p.returncode == 0, p.stderr
    assert tracked == [] and "tracks hc_l32, which have no snapshots" in p.stderr and "left as it is" in p.stderr

    p, tracked = _run(tmp_path, ["preln_l32"], TRACK_PARTIAL="1")  # asked for: replaced by the run found
    assert p.returncode == 0, p.stderr
    assert len(tracked) == 1 and tracked[0].startswith("track ") and "preln_l32" in tracked[0]
    assert "hc_l32" not in tracked[0]

    p, tracked = _run(tmp_path, ["preln_l32", "hc_l32"])  # snapshots of every tracked run: replaced
    assert p.returncode == 0, p.stderr
    assert len(tracked) == 1 and "preln_l32" in tracked[0] and "hc_l32" in tracked[0]

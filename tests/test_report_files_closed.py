"""`claims.runs_from_report` (what `depthlens plan REPORT_DIR` and the claims tests read) leaves no netCDF file
open. It used to open each report dataset lazily and never close it; with a file of string variables open on one
handle, a second handle closed and a third opened, HDF5 2.2.0 (bundled with netCDF4 1.7.5) dereferences a freed file
in `H5F_addr_decode` (HDFGroup/hdf5#3649, Unidata/netcdf-c#2510): `tests/test_claims.py` then
`tests/test_json_every_command.py -k plan` in one process segfaulted. A tiny report of two runs here, on the
checkpoint names (strings) a report stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from depthlens.studies.claims import runs_from_report

REPO = Path(__file__).resolve().parents[1]
NAMES = ["hc_l4", "hc_l4_s1"]


def _report(d: Path, values: list[float]) -> Path:
    """A report directory: summary.json's two records and one merged causal.nc, its checkpoint coord strings."""
    d.mkdir(parents=True, exist_ok=True)
    recs = [{"checkpoint": n, "design": "hc", "n_layer": 4, "seed": s} for s, n in enumerate(NAMES)]
    (d / "summary.json").write_text(json.dumps(recs))
    ds = xr.Dataset(
        {"clean_loss": ("checkpoint", np.array(values), {"long_name": "loss", "units": "nats"})},
        coords={"checkpoint": NAMES},  # one string variable: with a second one this HDF5 happens not to crash
        attrs={"source": "depthlens test"},
    )
    tmp = d / "causal.nc.tmp"
    ds.to_netcdf(tmp, engine="netcdf4")
    os.replace(tmp, d / "causal.nc")  # a new file on the same path, as the report writer replaces one
    return d


def _open_on(path: Path) -> list[str]:
    """This process's file descriptors on `path`."""
    fds = Path("/proc/self/fd")
    out = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if os.path.realpath(target) == os.path.realpath(path):
            out.append(fd.name)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")
def test_the_report_datasets_are_read_whole_and_closed(tmp_path):
    d = _report(tmp_path / "rep", [2.5, 3.0])
    runs = runs_from_report(d, metrics=["causal"])
    assert _open_on(d / "causal.nc") == []  # nothing open while the runs are alive
    assert sorted(runs) == [("hc", 4, 0), ("hc", 4, 1)]
    assert [float(runs[("hc", 4, s)]["causal"]["clean_loss"]) for s in (0, 1)] == [2.5, 3.0]
    _report(d, [7.0, 8.0])  # replaced on the same path: read again, the new content; the runs read first keep theirs
    again = runs_from_report(d, metrics=["causal"])
    assert [float(again[("hc", 4, s)]["causal"]["clean_loss"]) for s in (0, 1)] == [7.0, 8.0]
    assert [float(runs[("hc", 4, s)]["causal"]["clean_loss"]) for s in (0, 1)] == [2.5, 3.0]
    assert _open_on(d / "causal.nc") == []


def test_reading_a_report_while_an_earlier_read_is_alive_does_not_crash(tmp_path):
    """The sequence that crashed `plan` (in a subprocess, so a segfault is a return code): one read kept alive (the
    claims tests' module fixture), a second read dropped (a `plan` call), a third read (the next `plan`). With lazily
    opened files it segfaults every time on this HDF5 (2.2.0); a use after free need not crash everywhere, so the
    test above, on the open descriptors, is the check that holds on any build."""
    d = _report(tmp_path / "rep", [2.5, 3.0])
    code = (
        "import gc, sys\n"
        "from depthlens.studies.claims import runs_from_report\n"
        "kept = runs_from_report(sys.argv[1], metrics=['causal'])\n"
        "dropped = runs_from_report(sys.argv[1], metrics=['causal'])\n"
        "del dropped\n"
        "gc.collect()\n"
        "third = runs_from_report(sys.argv[1], metrics=['causal'])\n"
        "print(sorted(third), float(third[('hc', 4, 1)]['causal']['clean_loss']))\n"
    )
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, str(d)],
        cwd=REPO,  # this checkout's depthlens
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[:3000])  # faulthandler: the stack first
    assert r.stdout.strip() == "[('hc', 4, 0), ('hc', 4, 1)] 3.0"

"""bench/gpu.sh --dry-run: the GPU bench's three steps (real-scale bench, trainer throughput, torchrun causal)
run end to end on CPU at toy size and leave parseable JSON with the fields the GPU run reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash + timeout")
def test_gpu_script_dry_run(tmp_path):
    reports = tmp_path / "reports"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), "--dry-run", "--reports", str(reports)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rs = json.loads((reports / "gpu_real_scale.json").read_text())
    (r,) = rs["results"]
    assert (r["model"], r["n_layer"], rs["machine"]["device"]) == ("preln", 4, "cpu")
    eq = r["causal"]["full_pass_equivalents"]
    assert {"depthlens", "naive", "nnsight"} <= set(eq) and all(v["wall"] > 0 for v in eq.values())
    # depthlens and the hook loop computed the same C matrix (the bench's own cross-check)
    assert max(r["causal"]["max_abs_diff_vs_depthlens"]["causal_naive"].values()) < 1e-4

    tr = json.loads((reports / "gpu_trainer.json").read_text())
    assert tr["run"] == "preln_l16_lr0.003" and tr["steps"] == 3 and tr["device"] == "cpu"
    assert tr["tokens_per_s"] > 0 and tr["mfu"] is None  # no peak FLOP/s on CPU: MFU is not made up
    assert tr["device_name"] == "cpu" and tr["torch"] and tr["n_params"] > 0
    assert "model.n_layer=2" in tr["overrides"] and "dtype=bf16" in tr["overrides"]  # the GPU run's dtype path

    ca = json.loads((reports / "gpu_causal.json").read_text())
    assert ca["nproc_per_node"] == 1 and ca["device"] == "cpu"
    assert isinstance(ca["headline"], dict) and ca["headline"] and "--dtype bf16" in ca["args"]
    assert not list(tmp_path.glob("depthlens-gpu.*"))  # the script's scratch dir is removed

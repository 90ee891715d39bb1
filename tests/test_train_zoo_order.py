"""scripts/train_zoo.sh trains the claim cells first (the design x depth cells the recipe trains with several
seeds), then the rest, deepest first within each: run with a stand-in interpreter that lists the recipe's runs
for real and records each run the script would train, in order (JOBS=1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the whole script, and the recipe listed by a real interpreter (about 4 s)
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_claim_cells_first_then_the_rest_deepest_first(tmp_path):
    stub = tmp_path / "python"
    stub.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -m ] && [ "$2" = depthlens.training.trainer ]; then\n'
        f'  [ "$4" = --list ] && exec {sys.executable} "$@"\n'
        '  echo "TRAIN $5"\n'  # -m depthlens.training.trainer RECIPE --run NAME [resume=false]
        "fi\n"  # the corpus and the adopt calls: nothing to do for this test
    )
    stub.chmod(0o755)
    given = ["lns_l4", "moda_l32", "preln_l16", "sandwich_l8", "full_attnres_l16_s4", "hc_l32_s3", "keel_l16"]
    env = {**os.environ, "PYTHON": str(stub), "JOBS": "1"}
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "train_zoo.sh"), "--force", *given],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    order = [ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("TRAIN ")]
    # claim cells (hc L=32, full_attnres and preln at L=16 have seeds _s1...) deepest first, then the others
    assert order == ["hc_l32_s3", "full_attnres_l16_s4", "preln_l16", "moda_l32", "keel_l16", "sandwich_l8", "lns_l4"]

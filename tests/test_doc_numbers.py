"""Numbers in README.md and docs/ that come from a committed report are checked against its data here, so a
regenerated report cannot leave a stale number behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "reports" / "smollm2" / "summary.json"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


@pytest.fixture(scope="module")
def smollm2():
    if not SMOLLM2.is_file():
        pytest.skip("reports/smollm2 not generated")
    return json.loads(SMOLLM2.read_text())


def test_readme_smollm2_range(smollm2):
    defs = smollm2["causal_definitions"]
    default = next(d for d in defs if (d["norm"], d["variant"], d["aggregator"]) == ("update", "current", "max"))
    others = [d["share_gt_0.45"] for d in defs if d is not default]
    text = (ROOT / "README.md").read_text()
    want = (f"scores {round(100 * default['share_gt_0.45'])} % late causal pairs above 0.45\nunder the default "
            f"definition and {round(100 * min(others))}–{round(100 * max(others))} % under the other definitions")
    assert want in text, want


def test_calibration_table_matches_the_report(smollm2):
    text = (ROOT / "docs" / "calibration.md").read_text()
    by = {(d["variant"], d["aggregator"], d["norm"]): d["share_gt_0.45"] for d in smollm2["causal_definitions"]}
    for variant in ("current", "future"):
        for agg in ("max", "mean", "p95", "p99", "pooled"):
            row = re.search(rf"^\| {variant} \| {agg} \| ([0-9.]+ %) \| ([0-9.]+ %) \|", text, re.M)
            assert row, (variant, agg)
            assert row.group(1) == _pct(by[(variant, agg, "update")]) and row.group(2) == _pct(by[(variant, agg, "resid")])

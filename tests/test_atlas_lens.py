"""The atlas's lens section ("Where the prediction forms", scripts/atlas.py) against its own datasets.

* the committed atlas: every model's *forms at* (trained and twin, logit and tuned lens) recounted by loops from
  the per-sequence agreement stored in `reports/atlas/<model>/data/*_lens.nc`, and the page quotes them;
* end to end on a tiny model: `scripts/atlas.py` renders the section and its figure from lens stages.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
ATLAS = ROOT / "reports" / "atlas"
STAGES = ("logit_lens", "tuned_lens", "untrained_logit_lens", "untrained_tuned_lens")


def _forms_by_loops(ds: xr.Dataset) -> float:
    """The first l / L whose mean over sequences of the per-sequence top-1 agreement exceeds forms_at."""
    seq = ds["top1_agree_seq"].values  # (layer, sequence)
    at = float(ds["forms_depth"].attrs["forms_at"])
    L = seq.shape[0] - 1
    for l in range(L + 1):
        if sum(float(x) for x in seq[l]) / seq.shape[1] > at:
            return l / L
    return float("nan")


def _models_with_lens() -> list[dict]:
    path = ATLAS / "atlas.json"
    if not path.exists():
        pytest.skip("reports/atlas not generated")
    have = [s for s in json.loads(path.read_text())["models"] if s.get("lens")]
    if not have:
        pytest.skip("no model of the committed atlas has lens stages yet")
    return have


def test_committed_forms_recount_from_the_datasets():
    models = _models_with_lens()
    page = (ATLAS / "README.md").read_text()
    assert "## Where the prediction forms: the logit lens and the tuned lens" in page
    for s in models:
        for stage, got in s["lens"].items():
            if stage not in STAGES:
                continue
            with xr.open_dataset(ATLAS / s["name"] / "data" / f"{stage}.nc") as ds:
                want = _forms_by_loops(ds)
                assert got["forms"]["estimate"] == pytest.approx(want, nan_ok=True), (s["name"], stage)
                assert got["kl"] == pytest.approx([float(x) for x in ds["lens_kl"].values])
                lo, hi = got["forms"]["low"], got["forms"]["high"]
                assert np.isnan(lo) or lo <= got["forms"]["estimate"] <= hi
        for kind in ("logit", "tuned"):
            tr = s["lens"].get(f"{kind}_lens")
            if tr is not None:  # the page's row quotes the trained estimate with its interval
                f = tr["forms"]
                assert f"| {s['name']} | {kind} | {f['estimate']:.2f} [{f['low']:.2f}, {f['high']:.2f}] |" in page


def test_atlas_lens_section_from_a_tiny_model(tmp_path):
    import depthlens
    from depthlens.diagnostics.lens import lens_readout
    from depthlens.io.dataset import write_netcdf
    from depthlens.models import ModelConfig, build_model
    from depthlens.runtime.evaldata import load_eval_data
    from helpers import load_script

    report, atlas = load_script("real_model_report"), load_script("atlas")
    model = build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0)
    ckpt = tmp_path / "tiny"
    depthlens.save(model, ckpt)
    out = tmp_path / "atlas" / "tiny"
    args = [str(ckpt), "--out", str(out), "--n-seq", "3", "--seq-len", "24", "--threads", "1", "--calibration", "none"]
    report.main(args + ["--stages", "angular,causal_update,untrained_causal_update"])  # what the page draws first
    data = load_eval_data(None, "bytes", n_seq=3, seq_len=24)
    train = load_eval_data(None, "bytes", n_seq=4, seq_len=24, split="train")
    for stage in STAGES:
        kind = stage.removeprefix("untrained_").removesuffix("_lens")
        extra = dict(train_data=train, steps=3, cache=False) if kind == "tuned" else {}
        write_netcdf(lens_readout(model, data, kind=kind, n_boot=50, **extra), out / "data" / f"{stage}.nc")
    (out / "data" / "lens_run.json").write_text(json.dumps({"stages": {"logit_lens": {"cpu_s": 1.5}}}))
    assert atlas.main([str(tmp_path / "atlas"), "tiny"]) == 0
    page = (tmp_path / "atlas" / "README.md").read_text()
    assert "## Where the prediction forms: the logit lens and the tuned lens" in page
    assert "figures/lens.png" in page and (tmp_path / "atlas" / "figures" / "lens.png").is_file()
    (s,) = json.loads((tmp_path / "atlas" / "atlas.json").read_text())["models"]
    assert set(STAGES) <= set(s["lens"]) and s["lens"]["costs"]["logit_lens"]["cpu_s"] == 1.5
    with xr.open_dataset(out / "data" / "logit_lens.nc") as ds:
        assert s["lens"]["logit_lens"]["forms"]["estimate"] == pytest.approx(_forms_by_loops(ds), nan_ok=True)
    assert (
        "| tiny | logit |" in page
        and "| tiny | tuned |" in page
        and "| corpus-bytes/train, 3 steps × 128 positions |" in page
    )

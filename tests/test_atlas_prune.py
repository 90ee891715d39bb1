"""The committed record of `depthlens prune` on the real models (reports/atlas/prune.json, written by
scripts/real-model-prune.sh): every atlas model and a depthlens checkpoint pruned by path with exit 0, each pruned
model reloaded by its own loader (plain transformers for the GGUF files' Hugging Face directories) and its held-out
loss recomputed within 1e-5 nats/token of the certificate, in every domain; the atlas page's table is this file's.
Reads JSON only (no model is loaded)."""

from __future__ import annotations

import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRUNE = ROOT / "reports" / "atlas" / "prune.json"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct")


def _runs() -> dict[str, dict]:
    return {r["model"]: r for r in json.loads(PRUNE.read_text())["runs"]}


def test_prune_ran_on_every_model_and_a_checkpoint():
    runs = _runs()
    for name in MODELS:
        r = runs[name]
        assert r["exit"] == 0, (name, r["stderr_last"])
        assert r["path"].endswith(f"{name}.gguf") and r["command"].startswith("depthlens prune ")
        assert r["input_format"] == "gguf" and r["output_format"] == "hf"
        c = r["check"]
        assert "error" not in c, (name, c.get("error"))
        assert (
            c["loader"].startswith("transformers.AutoModelForCausalLM.from_pretrained")
            and c["versions"]["transformers"]
        )
        assert not any(
            m.startswith(("depthlens.models", "depthlens.adapters.hf", "depthlens.adapters.load"))
            for m in c["depthlens_modules_imported"]
        )
    native = [r for r in runs.values() if r.get("input_format") == "depthlens"]
    assert native and all(r["exit"] == 0 and r["check"]["loader"].startswith("depthlens.load") for r in native)


def test_reloaded_loss_is_the_certified_loss_and_within_tolerance():
    """|recomputed - certified| <= 1e-5 nats/token per domain, the bound within the tolerance, Δloss within the
    bound, k layers gone from the reloaded model, and the certificate's numbers consistent with each other."""
    for name, r in _runs().items():
        if r["exit"]:
            continue
        assert r["k"] >= 1 and len(r["layers_removed"]) == r["k"] == len(set(r["layers_removed"]))
        assert r["k"] <= r["k_max"] and all(0 < l < r["n_layer_before"] - 1 for l in r["layers_removed"])
        assert r["check"]["n_layer_loaded"] == r["n_layer_before"] - r["k"]
        assert r["check"]["eval_sha256_matches"] is True
        domains = r["domains"]
        assert "pooled" in domains and len(domains) >= 3, name  # pooled and at least two domains (prose, code)
        assert sum(v["n_sequences"] for d, v in domains.items() if d != "pooled") == domains["pooled"]["n_sequences"]
        assert domains["pooled"]["n_sequences"] == len(r["heldout_sequences"])
        for d, v in domains.items():
            assert v["n_sequences"] >= 2, (name, d)  # a t bound needs two sequences
            assert abs(v["pruned_loss_difference"]) <= 1e-5, (name, d, v["pruned_loss_difference"])
            assert abs(v["recomputed_pruned_loss"] - v["pruned_loss"]) <= 1e-5
            assert abs(v["clean_loss_difference"]) <= 1e-5, (name, d, v["clean_loss_difference"])
            assert math.isclose(v["delta"], v["pruned_loss"] - v["clean_loss"], abs_tol=1e-9)
            assert v["delta"] <= v["upper_bound"] <= r["tolerance"], (name, d)
            assert r["k_within_tolerance"][d] >= r["k"]


def test_atlas_page_table_is_the_json():
    """scripts/atlas.py renders one row per model and domain from prune.json; the committed page, once it has the
    section, holds exactly those rows."""
    from helpers import load_script

    doc = json.loads(PRUNE.read_text())
    lines = load_script("atlas")._prune_section(doc)
    assert lines[1] == "## `depthlens prune` on the three models"
    rows = [x for x in lines if x.startswith("| ") and not x.startswith("| model ")]
    assert len(rows) == sum(len(r["domains"]) if not r["exit"] else 1 for r in doc["runs"])
    for r in doc["runs"]:
        for d, v in r["domains"].items():
            assert any(x.startswith(f"| {r['model']} |") and f"| {d} ({v['n_sequences']}) |" in x for x in rows)
    page = (ROOT / "reports" / "atlas" / "README.md").read_text()
    if lines[1] in page:
        assert all(x in page for x in rows)

"""The committed real-model atlas (reports/atlas/) against its own committed datasets, recounted independently.

* the causal share at all N sequences (current variant, max aggregator) is recounted from each model's
  C(s, t) matrix by a plain loop over the late pairs;
* the pruning table (mean excess loss, wins, the least harmful criterion) is recomputed from the loss curves;
* every interval of the page contains its estimate and names its method;
* the README sentence about the atlas quotes numbers that are in atlas.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
ATLAS = ROOT / "reports" / "atlas"
pytestmark = pytest.mark.skipif(not (ATLAS / "atlas.json").exists(), reason="reports/atlas not generated")


def _atlas() -> dict:
    return json.loads((ATLAS / "atlas.json").read_text())


def _late_share(m: np.ndarray, theta: float) -> float:
    L = m.shape[0]
    a = L // 4
    pairs = [(s, t) for s in range(a, L) for t in range(s + 1, L)]
    return sum(bool(m[s, t] > theta) for s, t in pairs) / len(pairs)


def test_causal_shares_recount_from_the_matrices():
    for s in _atlas()["models"]:
        rows = {(r["norm"], r["variant"], r["aggregator"]): r for r in s.get("causal_definitions", [])}
        norms = {n for n, _, _ in rows}  # every definition of docs/calibration.md the atlas computed
        assert norms == {"update"} | ({"resid"} if "causal_resid" not in s["missing_stages"] else set()), s["name"]
        for (norm, variant, agg), r in rows.items():
            with xr.open_dataset(ATLAS / s["name"] / "data" / f"causal_{norm}.nc") as ds:
                assert ds.attrs["norm"] == norm
                m = ds["causal_score"].sel(variant=variant, aggregator=agg).values
            assert r["trained"]["share_full"] == pytest.approx(_late_share(m, 0.45)), (s["name"], norm, variant, agg)
            for key in ("trained", "untrained"):
                h = r.get(key)
                if h and h.get("ci_low") is not None:
                    assert h["ci_low"] <= h["share"] <= h["ci_high"] and h["ci_method"] and h["ci_unit"]
            d = r.get("trained_minus_untrained")
            if d:
                assert d["low"] <= d["estimate"] <= d["high"] and "paired" in d["method"]


def test_pruning_table_recomputes_from_the_curves():
    for s in _atlas()["models"]:
        p = s.get("pruning")
        if not p:
            continue
        with xr.open_dataset(ATLAS / s["name"] / "data" / "pruning.nc") as ds:
            loss = ds["loss"].load()
            clean = float(ds["loss_clean"])
        assert p["clean_loss"] == pytest.approx(clean)
        ks = list(range(1, s["n_layer"] // 2 + 1))
        assert p["k"] == ks
        excess = {str(c): float(np.mean(loss.sel(criterion=c).values[1:] - clean)) for c in loss["criterion"].values}
        assert p["mean_excess_loss"] == pytest.approx(excess)
        det = [c for c in excess if c != "random"]
        assert p["winner"] == min(det, key=excess.get)
        best = [min(det, key=lambda c: float(loss.sel(criterion=c, k=k))) for k in ks]
        assert p["wins"] == {c: best.count(c) for c in det}


DISPLAY = {"smollm2-135m-instruct": "SmolLM2", "gemma-3-270m": "Gemma", "qwen2.5-coder-0.5b-instruct": "Qwen"}


def _check_heldout_claims(sentence: str, display: str, h: dict) -> None:
    """The README's held-out pruning claim for one model: the k range, each scope's lowest mean excess loss over
    k <= L/4, and where (if anywhere) the pooled best cut is distinguishable from every other criterion."""
    from helpers import load_script

    want = f"on {display} at k ≤ {h['scopes']['pooled']['k_quarter'][-1]}"
    assert want in sentence, want
    for scope, summ in h["scopes"].items():
        assert f"{scope} `{summ['winner_quarter']}`" in sentence, (display, scope)
    yes, _ = load_script("atlas")._distinguishable(h["scopes"]["pooled"]["rows"])
    claim = (
        "at no k is the best cut distinguishable"
        if not yes
        else f"distinguishable only at k = {', '.join(map(str, yes))}"
    )
    assert claim in sentence, claim
    # the random baselines, in this model's clause: how many draws ran, or that none did
    clause = sentence.split(f"on {display} at k ≤", 1)[1].split(";", 1)[0]
    draws = (
        f"with {h['n_random']} random draws per k and baseline" if h.get("n_random") else "before its random draws ran"
    )
    assert draws in clause, (display, draws)


def test_readme_sentence_quotes_the_atlas():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- atlas -->(.*?)<!-- /atlas -->", text, re.S)
    assert m, "README has no atlas sentence"
    sentence = " ".join(m.group(1).split())
    atlas = _atlas()
    # pruning: only what the held-out curves show (the in-sample curves name no winner)
    assert "the least harmful cut is" not in sentence
    zoo = ROOT / "reports" / "pruning-zoo" / "pruning.json"
    n = re.search(r"(\d+) random draws per k ran on a zoo checkpoint", sentence)
    if n:  # the zoo page's numbers, as the sentence quotes them
        (z,) = json.loads(zoo.read_text())["models"]
        assert z["pruning_heldout"]["n_random"] == int(n.group(1))
        assert {"greedy", "predicted"} <= set(z["pruning_heldout"]["criteria"])
    for s in atlas["models"]:
        h = s.get("pruning_heldout")
        if not h:  # no held-out curves: the sentence names no pruning winner for this model
            assert f"{DISPLAY[s['name']]} `" not in sentence.split("held out", 1)[-1], s["name"]
        else:
            _check_heldout_claims(sentence, DISPLAY[s["name"]], h)
        head = next(
            (
                r
                for r in s.get("causal_definitions", [])
                if (r["norm"], r["variant"], r["aggregator"]) == ("update", "current", "max")
            ),
            None,
        )
        if head and head.get("untrained"):
            want = f"{DISPLAY[s['name']]} {100 * head['trained']['share']:.0f} % (twin {100 * head['untrained']['share']:.0f} %)"
            assert want in sentence, want
        shuffled = (s.get("shuffled_control") or {}).get("causal")
        if shuffled:  # the second control, as the page's paired interval gives it
            d = shuffled["trained_minus_shuffled"]
            want = (
                f"{DISPLAY[s['name']]}'s causal share is then {100 * shuffled['shuffled']['share']:.0f} % (trained − "
                f"shuffled {100 * d['estimate']:+.1f} pp [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}])"
            ).replace("-", "−")
            assert want in sentence, want
            perm_sh = (s.get("shuffled_control") or {}).get("perm_abs")
            if perm_sh and f"{DISPLAY[s['name']]}'s late-swap share" in sentence:
                p = perm_sh["trained_minus_shuffled"]
                numbers = (
                    f"{100 * perm_sh['shuffled']['share']:.0f} % shuffled (trained − shuffled {100 * p['estimate']:+.1f} "
                    f"pp [{100 * p['low']:+.1f}, {100 * p['high']:+.1f}])"
                ).replace("-", "−")
                want = f"{DISPLAY[s['name']]}'s late-swap share falls to {numbers}, so that one training made"
                assert want in sentence and p["low"] > 0, want
            if d["high"] < 0 or d["low"] <= 0 <= d["high"]:  # not above its shuffled twin: the sentence says so
                assert (
                    "the weights' scales alone give that share, so it is no evidence of what training learned"
                    in sentence
                )
        perm = {r["metric"]: r for r in s.get("permutation_definitions", [])}.get("perm_abs")
        if perm and perm.get("untrained"):  # the permutation headline, trained beside its twin
            want = (
                f"{DISPLAY[s['name']]} {100 * perm['trained']['share']:.0f} % of late pairs "
                f"(twin {100 * perm['untrained']['share']:.0f} %)"
            )
            assert want in sentence, want


def test_every_command_ran_by_path_on_every_model():
    """scripts/real-model-cli.sh: `info | angular | causal | permute` exited 0 on each model of the atlas, by path;
    the design is read from the block (Gemma 3: Sandwich-LN); each printed share lies in its own interval; the
    page's table is the JSON's."""
    cli = _atlas().get("cli")
    if cli is None:
        pytest.skip("scripts/real-model-cli.sh not run")
    runs = {(r["model"], r["command"]): r for r in cli["runs"]}
    page = (ATLAS / "README.md").read_text()
    for s in _atlas()["models"]:
        for cmd in ("info", "angular", "causal", "permute"):
            r = runs[(s["name"], cmd)]
            assert r["exit"] == 0, (s["name"], cmd, r["stderr_last"])
            assert f"| {s['name']} | `{cmd}` | {r['eval']} | 0 | {r['wall_s']} |" in page
            if cmd in ("causal", "permute"):
                j = r["json"]
                assert j["ci_low"] <= j["share"] <= j["ci_high"] and j["ci_method"]
        assert s["design"] in runs[(s["name"], "info")]["json"]["design_name"]
        if s["family"].startswith("gemma"):
            assert runs[(s["name"], "info")]["json"]["design_name"].startswith("Sandwich-LN")


def test_permutation_shares_recount_from_the_matrices():
    """Every model of the atlas has the permutation score at the atlas's eval size with its untrained twin; each
    share at all N is a plain loop over the late pairs of P_abs / P_rel / P_KL, each interval contains its
    estimate, and the per-layer importance (the permutation pruning criterion's ranking) is the mean of the
    layer's computed swaps."""
    for s in _atlas()["models"]:
        assert "permutation" not in s["missing_stages"] and "untrained_permutation" not in s["missing_stages"]
        rows = {r["metric"]: r for r in s["permutation_definitions"]}
        assert set(rows) == {"perm_abs", "perm_rel", "perm_kl"}
        for twin in (False, True):
            name = "untrained_permutation" if twin else "permutation"
            with xr.open_dataset(ATLAS / s["name"] / "data" / f"{name}.nc") as ds:
                mats = {k: ds[k].values for k in rows}
                L = int(ds.attrs["n_layer"])
                assert ds.attrs["eval_n_seq"] == s["eval"]["n_seq"] and ds.attrs["eval_seq_len"] == s["eval"]["seq_len"]
            for metric, r in rows.items():
                h = r["untrained" if twin else "trained"]
                assert h["share_full"] == pytest.approx(_late_share(mats[metric], r["threshold"])), (s["name"], metric)
                late = [mats[metric][i, j] for i in range(L // 4, L) for j in range(i + 1, L)]
                assert r["median_late_untrained" if twin else "median_late"] == pytest.approx(float(np.median(late)))
                assert h["ci_low"] <= h["share"] <= h["ci_high"] and h["ci_method"] and h["ci_unit"]
            m = mats["perm_abs"]
            want = [
                np.mean([m[l, j] for j in range(L) if j != l and not np.isnan(m[l, j])])
                if any(j != l and not np.isnan(m[l, j]) for j in range(L))
                else None
                for l in range(L)
            ]
            got = s["permutation_importance_untrained" if twin else "permutation_importance"]
            assert [g is None for g in got] == [w is None for w in want]
            assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None])
        for r in rows.values():
            d = r["trained_minus_untrained"]
            assert d["low"] <= d["estimate"] <= d["high"] and "paired" in d["method"]
        assert "permutation" in s["pruning"]["mean_excess_loss"], s["name"]  # the criterion it feeds


@pytest.mark.slow
def test_atlas_page_from_a_tiny_model(tmp_path):
    """scripts/atlas.py end to end on every stage of a tiny model (pruning added after the permutation stage, as
    the atlas runs them): the page has the permutation table (each share recounted from the matrices) and the
    permutation pruning criterion, and lists nothing as missing."""
    import depthlens
    from depthlens.models import ModelConfig, build_model
    from helpers import load_script

    report, atlas = load_script("real_model_report"), load_script("atlas")
    ckpt = tmp_path / "tiny"
    depthlens.save(build_model(ModelConfig.debug("preln", n_layer=4, vocab_size=257, max_seq_len=64), seed=0), ckpt)
    out = tmp_path / "atlas" / "tiny"
    args = [str(ckpt), "--out", str(out), "--n-seq", "3", "--seq-len", "24", "--threads", "1", "--calibration", "none"]
    report.main(args + ["--stages", "angular,causal_update,untrained_causal_update,pruning"])
    report.main(args + ["--stages", "permutation,untrained_permutation,causal_resid,pruning", "--resume"])
    # the held-out curves in two runs (the cheap rankings, then greedy and the prediction), and the random draws
    held = ["--stages", "pruning_heldout", "--resume", "--heldout-criteria"]
    report.main(args + held + ["angular_block,block_influence,skip_loss,causal,permutation"])
    report.main(args + held + [""] + ["--stages", "pruning_heldout,pruning_random"])
    report.main(args + ["--stages", "shuffled_causal_update,shuffled_permutation", "--resume"])
    assert atlas.main([str(tmp_path / "atlas"), "tiny"]) == 0
    doc = json.loads((tmp_path / "atlas" / "atlas.json").read_text())
    (s,) = doc["models"]
    assert s["missing_stages"] == [] and s["permutation_pairs"] == 3  # late pairs of L = 4: (1,2) (1,3) (2,3)
    page = (tmp_path / "atlas" / "README.md").read_text()
    assert "## Permutation score, trained and untrained twin" in page and "figures/permutation.png" in page
    for r in s["permutation_definitions"]:
        with xr.open_dataset(out / "data" / "permutation.nc") as ds:
            assert r["trained"]["share_full"] == pytest.approx(_late_share(ds[r["metric"]].values, r["threshold"]))
        assert f"| tiny | {r['metric']} | {r['threshold']} |" in page
        d = r["trained_minus_untrained"]  # a bootstrap over the 3 shared sequences, and it says so
        assert d["low"] <= d["estimate"] <= d["high"] and d["n_units"] == 3 and d["unit"] == "eval sequences"
    assert "permutation" in s["pruning"]["mean_excess_loss"] and "## Not in this atlas" not in page
    h = s["pruning_heldout"]
    assert h["criteria"] == [
        "angular_block",
        "block_influence",
        "skip_loss",
        "causal",
        "permutation",
        "greedy",
        "predicted",
    ]
    assert "## Layer pruning, held out" in page and "figures/pruning_heldout.png" in page
    _recount_heldout(out / "data", h)
    assert atlas.main([str(tmp_path / "atlas"), "tiny", "--pruning-only"]) == 0  # the section alone (a zoo page)
    alone = (tmp_path / "atlas" / "README.md").read_text()
    assert alone.startswith("# Held-out layer pruning: tiny") and "### tiny (L = 4" in alone
    assert json.loads((tmp_path / "atlas" / "pruning.json").read_text())["models"][0]["pruning_heldout"] == h
    norms = [(r["norm"], r.get("untrained") is not None) for r in s["causal_definitions"]]
    assert set(norms) == {("update", True), ("resid", False)}  # resid measured on the trained model only
    assert "| tiny | resid | current | max |" in page
    # the second control: trained, fresh-init and shuffled twin side by side, the shuffled share recounted
    shuffled = s["shuffled_control"]
    assert set(shuffled) == {"causal", "perm_abs"} and "Not computed yet" not in page
    with xr.open_dataset(out / "data" / "shuffled_permutation.nc") as ds:
        r = shuffled["perm_abs"]
        assert r["shuffled"]["share_full"] == pytest.approx(_late_share(ds["perm_abs"].values, r["threshold"]))
    d = shuffled["causal"]["trained_minus_shuffled"]
    assert d["low"] <= d["estimate"] <= d["high"] and d["unit"] == "eval sequences"
    assert "## The second control: the shuffled twin" in page and "| tiny | P_abs |" in page
    where = "not distinguishable from" if d["low"] <= 0 <= d["high"] else ("above" if d["low"] > 0 else "below")
    assert f"tiny's C share is {where} its shuffled twin's" in page
    model_page = (out / "README.md").read_text()
    assert "**Permutation, shuffled twin**" in model_page and "not computed (stages `shuffled_*`)" not in model_page


def _recount_heldout(data_dir: Path, h: dict) -> None:
    """The atlas's held-out table from the stored per-sequence losses by plain loops: each scope's loss per
    criterion and k, the best criterion, the criteria tied with it (the same layers in both folds) and the
    wins (each tied criterion counts one); every interval contains its estimate and names its pairing."""
    with xr.open_dataset(data_dir / "pruning_heldout.nc") as ds:
        seq = ds["seq_loss"].values
        removed = ds["removed"].values
        crits = [str(c) for c in ds["criterion"].values]
        domains = [str(d) for d in ds["domain"].values]
    for scope, summ in h["scopes"].items():
        ix = [i for i, d in enumerate(domains) if scope == "pooled" or d == scope]
        wins = {c: 0 for c in crits}
        for k in h["k"]:
            means = {}
            for ci, c in enumerate(crits):
                total = 0.0
                for i in ix:
                    total += float(seq[ci, k, i])
                means[c] = total / len(ix)
                assert summ["loss"][c][k - 1] == pytest.approx(means[c])
            best = min(crits, key=lambda c: (means[c], crits.index(c)))
            tied = []
            for ci, c in enumerate(crits):
                same = True
                for f in (0, 1):
                    if removed[f, ci, k].tolist() != removed[f, crits.index(best), k].tolist():
                        same = False
                if same:
                    tied.append(c)
                    wins[c] += 1
            row = summ["rows"][k - 1]
            assert row["best"] == best and sorted(row["tied"]) == sorted(tied), (scope, k)
            for iv in row["vs_best"].values():
                if iv["low"] is not None:
                    assert iv["low"] <= iv["estimate"] <= iv["high"] and "paired" in iv["method"]
        assert summ["wins"] == wins, scope
        quarter = {c: sum(c in r["tied"] for r in summ["rows"] if r["k"] in summ["k_quarter"]) for c in crits}
        assert summ["wins_quarter"] == quarter, scope


def test_heldout_pruning_recounts_from_the_stored_data():
    """Every model with held-out pruning curves: its atlas table recounted from pruning_heldout.nc by loops."""
    models = [s for s in _atlas()["models"] if s.get("pruning_heldout")]
    if not models:
        pytest.skip("no model of the committed atlas has held-out pruning curves yet")
    for s in models:
        _recount_heldout(ATLAS / s["name"] / "data", s["pruning_heldout"])


def test_the_default_prune_criterion_is_the_zoo_pages_minimax():
    """docs/concepts.md#layer-pruning's reason for `depthlens prune`'s default, against reports/pruning-zoo/: the
    default has the smallest worse-domain mean excess loss over k <= L/4; it and block_influence have the lowest
    pooled one; pooled, neither is distinguishably worse than the best at any k <= L/4."""
    from depthlens.diagnostics.pruning_heldout import DEFAULT_CRITERION

    path = ROOT / "reports" / "pruning-zoo" / "pruning.json"
    if not path.exists():
        pytest.skip("reports/pruning-zoo not generated")
    (s,) = json.loads(path.read_text())["models"]
    scopes = s["pruning_heldout"]["scopes"]
    domains = [d for d in scopes if d != "pooled"]
    crits = s["pruning_heldout"]["criteria"]
    worse = {c: max(scopes[d]["mean_excess_quarter"][c] for d in domains) for c in crits}
    assert min(worse, key=worse.get) == DEFAULT_CRITERION == "greedy"
    pooled = scopes["pooled"]["mean_excess_quarter"]
    assert sorted(crits, key=pooled.get)[:2] == sorted(["greedy", "block_influence"], key=pooled.get)
    assert pooled["block_influence"] == pytest.approx(pooled["greedy"], abs=5e-4)  # "ties it pooled"
    assert scopes["code"]["winner_quarter"] == "block_influence" and scopes["english"]["winner_quarter"] == "greedy"
    lead_code = (
        scopes["code"]["mean_excess_quarter"]["greedy"] - scopes["code"]["mean_excess_quarter"]["block_influence"]
    )
    lead_prose = (
        scopes["english"]["mean_excess_quarter"]["block_influence"] - scopes["english"]["mean_excess_quarter"]["greedy"]
    )
    assert lead_prose > lead_code > 0  # "greedy leads on prose by more"
    k_quarter = set(scopes["pooled"]["k_quarter"])
    for r in scopes["pooled"]["rows"]:
        if r["k"] in k_quarter:
            for c in ("greedy", "block_influence"):
                if c not in r["tied"]:
                    assert r["vs_best"][c]["low"] <= 0, (c, r["k"])


def test_the_default_criterion_sentence_quotes_the_atlas():
    """docs/concepts.md's sentence on `depthlens prune`'s default against the three real models, recounted from
    atlas.json: where greedy has the lowest pooled mean excess loss over k <= L/4, and where it does not, the
    winner's lead and the k at which greedy's paired interval against the best lies above 0."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    m = re.search(r"<!-- atlas-default -->(.*?)<!-- /atlas-default -->", text, re.S)
    assert m, "docs/concepts.md has no atlas-default sentence"
    sentence = " ".join(m.group(1).split())
    wins, others = [], []
    for s in _atlas()["models"]:
        h = s.get("pruning_heldout")
        if not h:
            continue
        pooled = h["scopes"]["pooled"]
        excess, k_quarter = pooled["mean_excess_quarter"], set(pooled["k_quarter"])
        worse = []
        for r in pooled["rows"]:  # by plain loops: greedy not tied with the best, its interval above 0
            iv = r["vs_best"].get("greedy")
            if r["k"] in k_quarter and "greedy" not in r["tied"] and iv is not None and iv["low"] > 0:
                worse.append(r["k"])
        if min(excess, key=excess.get) == "greedy":
            wins.append(DISPLAY[s["name"]])
            assert not worse, s["name"]
        else:
            w = min(excess, key=excess.get)
            others.append(
                f"on {DISPLAY[s['name']]} `{w}` is lower ({excess[w]:.3f} against {excess['greedy']:.3f} nats), and "
                f"there greedy's cut is distinguishably worse than the best at k = {', '.join(map(str, worse))}"
            )
    assert f"`greedy` has the lowest mean excess loss on {' and '.join(wins)}" in sentence
    for want in others:
        assert want in sentence, want


def test_the_atlas_script_computes_the_stages_the_page_reads():
    """scripts/real-model-atlas.sh's default STAGES is scripts/atlas.py's list (the study's stages the page reads),
    evaluated by bash as the script does, not a list of its own that can drift from it."""
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import atlas
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    line = next(
        x for x in (ROOT / "scripts" / "real-model-atlas.sh").read_text().splitlines() if x.startswith("STAGES=")
    )
    assert not re.search(r"[a-z_]+,[a-z_]+", line), f"a hand-written stage list: {line}"
    got = subprocess.run(
        ["bash", "-c", f'PY="{sys.executable}"; unset STAGES; {line}; echo "$STAGES"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert got.split(",") == list(atlas.STAGES)

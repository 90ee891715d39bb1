"""`--untrained-seeds K` (untrained twins only for training seeds < K) and the mixed-recipe guard (the seeds of one
design and depth trained from different recipes are not pooled silently), on tiny checkpoints with several seeds.

Each checkpoint's weights come from another init seed (100 + its training seed) than its untrained twin (its
training seed), so trained and at-init numbers differ; the eval losses are recomputed here from the models with
plain torch, and the crossed interval of a loss change from the two-way layout written out (as tests/test_claims.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from typer.testing import CliRunner

import depthlens
from depthlens.cli import app
from depthlens.errors import UsageError
from depthlens.models import ModelConfig, build_model
from depthlens.stats.crossed import CROSSED
from depthlens.stats.orderings import Claim, check, rows
from depthlens.studies import report as B
from depthlens.studies.claims import mixed_recipe_rows

SEEDS = (0, 1, 2)
CELLS = (("preln", 4), ("preln", 2), ("hc", 4))
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness; def f(x):\n    return x * 2 + 1\n"
) * 40
LOSS = Claim("sign", "loss_change", "preln", None, 4, "test: Pre-LN worsens from L = 2 to L = 4", sign=1)
ORDER = Claim("order", "causal", "hc", "preln", 4, "test: HC above Pre-LN")


def _config(arch: str, L: int) -> ModelConfig:
    return ModelConfig.debug(arch, n_layer=L, vocab_size=257, max_seq_len=64)


def _recipe(arch: str, L: int, seed: int, **changed) -> dict:
    """A train.json recipe as the trainer writes it: per-run fields (seed, name, out, export, ...) and the rest."""
    name = f"{arch}_l{L}_s{seed}"
    return {
        "model": {"arch": arch, "n_layer": L, "d_model": 32},
        "lr": 0.006,
        "steps": 400,
        "seed": seed,
        "data_seed": seed,
        "name": name,
        "out": f"runs/{name}",
        "export": f"checkpoints/{name}",
        "resume": False,
        "meta": {"lr_source": "test"},
        "snapshot_every_log2": seed == 0,
        **changed,
    }


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeded")
    out = {}
    for arch, L in CELLS:
        for s in SEEDS:
            model = build_model(_config(arch, L), seed=100 + s)  # "trained": not the twin's init
            path = root / f"{arch}_l{L}_s{s}"
            out[(arch, L, s)] = depthlens.save(model, path, train={"seed": s, "recipe": _recipe(arch, L, s)})
    return out


@pytest.fixture(scope="module")
def two_twins(ckpts, text, tmp_path_factory):
    """A report on every checkpoint with twins for seeds 0 and 1 only."""
    opts = B.ReportOptions(data=text, n_seq=6, seq_len=32, n_boot=50, metrics=("causal",), untrained_seeds=2)
    out = tmp_path_factory.mktemp("rep") / "report"
    return B.build_report(list(ckpts.values()), out, opts), out


def _nll_per_sequence(model: torch.nn.Module, tokens: torch.Tensor) -> np.ndarray:
    """Mean next-token NLL per sequence at positions 1..T-2 (targets tokens[:, 2:]), as the report defines it."""
    with torch.no_grad():
        logits = model(tokens).float()
    nll = F.cross_entropy(logits[:, 1:-1].transpose(1, 2), tokens[:, 2:], reduction="none")
    return nll.mean(-1).double().numpy()


def test_twins_only_for_the_first_seeds_and_the_report_says_so(two_twins):
    rep, out = two_twins
    for r, e in zip(rep.records, rep.entries):
        has = r["seed"] < 2
        assert (r["eval_loss_untrained"] is not None) == has and (r["causal_share_untrained"] is not None) == has
        assert (r["untrained_init"] is not None) == has and bool(e.untrained) == has
        said = [n for n in e.notes if "--untrained-seeds 2" in n]
        assert len(said) == (0 if has else 1), e.notes
    man = json.loads((out / "manifest.json").read_text())
    assert man["options"]["untrained_seeds"] == 2
    assert "untrained twins only for training seeds < 2, --untrained-seeds 2" in (out / "README.md").read_text()
    assert "untrained_seeds" not in B.ReportOptions().as_dict()  # the default records what it did before


def test_the_twins_are_the_step0_models_of_their_seeds(two_twins):
    rep, _ = two_twins
    tokens = rep.data.tokens
    for r in rep.records:
        if r["seed"] >= 2:
            continue
        twin = build_model(_config(r["design"], r["n_layer"]), seed=r["seed"])
        assert r["eval_loss_untrained"] == pytest.approx(_nll_per_sequence(twin, tokens).mean(), rel=1e-5)


def _two_way_half_width(deep: np.ndarray, shallow: np.ndarray, df: float) -> float:
    """The crossed interval's half-width of mean(deep) − mean(shallow), runs × sequences (tests/test_claims.py)."""
    N = deep.shape[1]
    var_seed = deep.mean(1).var(ddof=1) / deep.shape[0] + shallow.mean(1).var(ddof=1) / shallow.shape[0]
    resid = lambda y: y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()  # noqa: E731
    ms_e = lambda y: np.sum(resid(y) ** 2) / ((y.shape[0] - 1) * (y.shape[1] - 1))  # noqa: E731
    col = deep.mean(0) - shallow.mean(0)
    shared = col.var(ddof=1) / N - ms_e(deep) / (deep.shape[0] * N) - ms_e(shallow) / (shallow.shape[0] * N)
    return float(stats.t.ppf(0.975, df) * np.sqrt(var_seed + max(shared, 0.0)))


def test_the_at_init_loss_change_pools_exactly_the_seeds_with_a_twin(two_twins):
    rep, _ = two_twins
    tokens = rep.data.tokens

    def losses(L: int, seeds, twin: bool) -> np.ndarray:
        cfg = _config("preln", L)
        return np.stack([_nll_per_sequence(build_model(cfg, seed=s if twin else 100 + s), tokens) for s in seeds])

    (row,) = [c for c in B.comparisons(rep.entries, rep.options, [LOSS]) if c.get("crossed")]
    assert row["n_runs"] == [3, 3] and row["untrained_n_runs"] == [2, 2]
    for tag, seeds, twin in (("", SEEDS, False), ("untrained_", (0, 1), True)):
        deep, shallow = losses(4, seeds, twin), losses(2, seeds, twin)
        d = row[f"{tag}difference"]
        assert d["n_units"] == len(seeds) and d["method"] == CROSSED
        assert d["estimate"] == pytest.approx(deep.mean() - shallow.mean(), abs=2e-6)  # fp32 losses near 5.6
        assert (d["high"] - d["low"]) / 2 == pytest.approx(_two_way_half_width(deep, shallow, d["df"]), rel=1e-4)
    res = check(LOSS, rep.records, [row])
    assert res["seeds"] == [0, 1, 2] and res["seeds_untrained"] == [0, 1] and res["n_runs_untrained"] == [2, 2]
    assert res["interval_untrained"]["n_units"] == 2
    assert "(at init: seeds 0-1, 2 + 2 of 3 + 3 runs)" in rows([res])[0][6]


def test_an_order_at_init_pools_the_seeds_with_a_twin_crossed_or_paired(two_twins):
    rep, _ = two_twins
    comps = B.comparisons(rep.entries, rep.options, [ORDER])
    (crossed,) = [c for c in comps if c.get("crossed")]
    per_seed = [c for c in comps if not c.get("crossed")]
    assert crossed["untrained_n_runs"] == [2, 2] and crossed["n_runs"] == [3, 3]
    table = {(r["design"], r["seed"]): r["causal_share_untrained"] for r in rep.records if r["n_layer"] == 4}
    for v, design in zip(crossed["untrained_values"], ("hc", "preln")):  # a design value: the mean of its twins
        assert v["n_units"] == 2 and v["estimate"] == pytest.approx(np.mean([table[(design, s)] for s in (0, 1)]))
    # without the crossed row: the paired per-seed differences, of the seeds with a twin on both sides only
    assert [c["seed"] for c in per_seed] == [0, 1, 2]
    assert ["untrained_diff" in c for c in per_seed] == [True, True, False]
    res = check(ORDER, rep.records, per_seed)
    diffs = [c["untrained_diff"] for c in per_seed[:2]]
    assert res["interval_untrained"]["n_units"] == 2
    assert res["interval_untrained"]["estimate"] == pytest.approx(np.mean(diffs))
    assert res["interval"]["n_units"] == 3 and res["seeds_untrained"] == [0, 1]


def test_untrained_seeds_must_be_a_positive_whole_number():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(UsageError, match="untrained_seeds"):
            B.ReportOptions(untrained_seeds=bad)
    one = B.ReportOptions(untrained_seeds=1)
    assert one.has_twin(0) and one.has_twin(None) and not one.has_twin(1)
    assert B.ReportOptions().has_twin(7)


# ---------------------------------------------------------------------------------------------------------------
# mixed recipes


def _runs(recipes):
    return [(("preln", 32, s), r) for s, r in recipes]


def test_a_mixed_cell_names_its_differing_fields_and_seeds():
    recipes = [(s, _recipe("preln", 32, s, lr=0.006 if s < 3 else 0.012)) for s in range(8)]
    (row,) = mixed_recipe_rows(_runs(recipes))
    assert row["line"] == "preln L=32: seeds 0-2 lr 0.006, seeds 3-7 lr 0.012"
    assert row["fields"] == ["lr"] and [g["seeds"] for g in row["groups"]] == [[0, 1, 2], [3, 4, 5, 6, 7]]
    two = [(s, _recipe("preln", 32, s, steps=800 if s in (1, 4) else 400)) for s in range(5)]
    two[4] = (4, {**two[4][1], "model": {**two[4][1]["model"], "d_model": 48}})
    (row,) = mixed_recipe_rows(_runs(two))
    assert row["fields"] == ["model.d_model", "steps"]
    assert row["line"] == (
        "preln L=32: seeds 0,2-3 model.d_model 32 steps 400, seed 1 model.d_model 32 steps 800, "
        "seed 4 model.d_model 48 steps 800"
    )
    unset = [(0, _recipe("preln", 32, 0)), (1, {k: v for k, v in _recipe("preln", 32, 1).items() if k != "steps"})]
    assert mixed_recipe_rows(_runs(unset))[0]["line"] == "preln L=32: seed 0 steps 400, seed 1 steps (unset)"


def test_per_run_fields_and_missing_recipes_are_not_a_mixed_cell():
    same = [(s, _recipe("preln", 32, s)) for s in range(4)]  # seed, data_seed, name, out, export, meta differ
    assert mixed_recipe_rows(_runs(same)) == []
    assert mixed_recipe_rows(_runs([(0, _recipe("preln", 32, 0)), (1, None), (2, {})])) == []
    other_cells = [(("preln", 16, 0), _recipe("preln", 16, 0)), (("preln", 32, 0), _recipe("preln", 32, 0, lr=1.0))]
    assert mixed_recipe_rows(other_cells) == []  # one run per cell: nothing is pooled


def test_a_report_warns_once_and_notes_the_mixed_cell_beside_its_claims(ckpts, text, tmp_path):
    paths = []
    for s in SEEDS:  # preln L = 4, seed 2 trained at another LR
        p = shutil.copytree(ckpts[("preln", 4, s)], tmp_path / "ck" / f"preln_l4_s{s}")
        if s == 2:
            train = json.loads((p / "train.json").read_text())
            train["recipe"]["lr"] = 0.012
            (p / "train.json").write_text(json.dumps(train))
        paths.append(p)
    paths += [ckpts[("hc", 4, s)] for s in SEEDS]
    out = tmp_path / "rep"
    args = ["report", *map(str, paths), "--out", str(out), "--data", str(text), "--n-seq", "4", "--seq-len", "32"]
    r = CliRunner().invoke(app, [*args, "--n-boot", "20", "--metrics", "causal", "--untrained-seeds", "1"])
    assert r.exit_code == 0, r.output
    line = "preln L=4: seeds 0-1 lr 0.006, seed 2 lr 0.012"
    warned = [w for w in r.stderr.splitlines() if w.startswith("depthlens: warning:")]
    assert warned == [f"depthlens: warning: mixed training recipes pooled as the seeds of one design and depth: {line}"]
    man = json.loads((out / "manifest.json").read_text())
    assert any(line in n for n in man["notes"]) and man["options"]["untrained_seeds"] == 1
    (row,) = [c for c in man["comparisons"] if c.get("mixed_recipe")]
    assert (row["design"], row["L"], row["fields"]) == ("preln", 4, ["lr"])
    assert line in (out / "README.md").read_text()
    recs = json.loads((out / "summary.json").read_text())
    assert sorted((x["design"], x["seed"]) for x in recs if x["eval_loss_untrained"] is not None) == [
        ("hc", 0),
        ("preln", 0),
    ]
    noted = check(ORDER, recs, man["comparisons"])
    assert f"mixed recipes pooled: {line}" in noted["note"]
    clean = check(Claim("order", "causal", "hc", "mhc", 4, "test: hc cell only"), recs, man["comparisons"])
    assert "mixed" not in (clean["note"] or "")


def test_the_option_on_the_command_line(ckpts, text, tmp_path):
    base = ["report", str(ckpts[("preln", 4, 0)]), "--out", str(tmp_path / "r"), "--data", str(text)]
    r = CliRunner().invoke(app, [*base, "--untrained-seeds", "0"])
    assert r.exit_code == 2 and not (tmp_path / "r").exists()
    assert "--untrained-seeds" in r.stderr and "Traceback" not in r.output


ZOO = Path(__file__).resolve().parents[1] / "reports" / "zoo" / "summary.json"


@pytest.mark.skipif(not ZOO.is_file(), reason="reports/zoo not generated")
def test_the_docs_at_init_facts_are_the_zoo_reports():
    """docs/performance.md's reasons for --untrained-seeds 3 come from the zoo report's twins of seeds 0-2 (a twin
    depends on its config, seed and the eval set, not on training, so a retrained zoo keeps them)."""
    recs = [r for r in json.loads(ZOO.read_text()) if r.get("seed") in (0, 1, 2)]
    cells = [(d, 16) for d in ("preln", "hc", "full_attnres")]
    cells += [(d, 32) for d in ("preln", "hc", "full_attnres", "mhc", "block_attnres")]

    def sd(field: str, cell) -> float:
        vals = [r[field] for r in recs if (r["design"], r["n_layer"]) == cell]
        assert len(vals) == 3 and None not in vals, (field, cell)
        return float(np.std(vals, ddof=1))

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text().split())
    assert max(sd("eval_loss_untrained", c) for c in cells) <= 0.03
    assert "the untrained eval loss varies by an SD of at most 0.03 nats" in text
    perm = [r["perm_share_untrained"] for r in recs if (r["design"], r["n_layer"]) in cells[3:6]]
    assert len(perm) == 9 and set(perm) == {0.0}
    assert "the untrained permutation share is 0 at every seed of the L = 32 claim cells" in text
    # the page's wording: across every design and depth with several seeds (not only the claim cells)
    several = sorted(
        {
            c
            for c in {(r["design"], r["n_layer"]) for r in recs}
            if sum((r["design"], r["n_layer"]) == c for r in recs) > 1
        }
    )
    causal = [sd("causal_share_untrained", c) for c in several]
    assert f"the untrained causal share does vary (SD {min(causal):.2f}–{max(causal):.2f})" in text

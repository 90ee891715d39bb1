"""Held-out pruning curves (diagnostics/pruning_heldout.py) against independent computations: every held-out
loss is the loss of a model rebuilt without the removed layers on the other fold's windows; every choice is
recounted on the calibration windows by plain loops; wins (ties included) are recounted from the dataset."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthlens.diagnostics.causal.engine import causal_scores
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.diagnostics.pruning import permutation_importance
from depthlens.diagnostics.pruning_heldout import (
    PairwiseModel,
    _causal_effect,
    _perm_importance,
    assign_folds,
    heldout_curves,
    prediction_error,
    random_baselines,
    summarize,
    upper_bound,
    window_domains,
)
from depthlens.errors import DepthlensError
from depthlens.models import ModelConfig, build_model
from depthlens.runtime.evaldata import EvalData

L = 6
DOMAINS = ["english"] * 3 + ["code"] * 4


@pytest.fixture(scope="module")
def setup():
    cfg = ModelConfig.debug("preln", n_layer=L)
    model = build_model(cfg, seed=3).eval()
    with torch.no_grad():  # layers of different importance (a random init makes them all alike)
        for l, block in enumerate(model.blocks):
            block.mlp.fn.down_proj.weight.mul_(0.2 + l)
    data = EvalData.from_tokens(torch.randint(0, cfg.vocab_size, (7, 20), generator=torch.Generator().manual_seed(0)))
    causal = causal_scores(model, data, variants=("current",))
    perm = permutation_scores(model, data, pairs="late")
    ds = heldout_curves(model, data, domains=DOMAINS, k_max=3, causal=causal, permutation=perm, n_pool=3)
    return cfg, model, data, causal, perm, ds


def _seq_loss_without(model, tokens, removed):
    """Independent: a Pre-LN model of the kept layers' weights, its plain forward, per-sequence mean NLL."""
    kept = [l for l in range(L) if l not in removed]
    small = build_model(ModelConfig.debug("preln", n_layer=len(kept)), seed=0).eval()
    sd = {}
    for name, value in model.state_dict().items():
        if name.startswith("blocks."):
            l = int(name.split(".")[1])
            if l in kept:
                sd[f"blocks.{kept.index(l)}." + name.split(".", 2)[2]] = value
        else:
            sd[name] = value
    small.load_state_dict(sd)
    with torch.no_grad():
        logits = small(tokens)[:, :-1].double()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
    return nll.reshape(tokens.shape[0], -1).mean(1).numpy()


def test_folds_alternate_within_each_domain():
    assert assign_folds(DOMAINS).tolist() == [0, 1, 0, 0, 1, 0, 1]
    with pytest.raises(DepthlensError, match="at least 2"):
        assign_folds(["a"])


def test_heldout_losses_are_the_rebuilt_model_on_the_other_fold(setup):
    _, model, data, _, _, ds = setup
    folds = ds["seq_fold"].values
    toks = data.tokens
    assert np.allclose(ds["clean_seq"].values, _seq_loss_without(model, toks, []), atol=2e-6)
    for crit in [str(c) for c in ds["criterion"].values]:
        for k in (1, 2, 3):
            for f in (0, 1):
                layers = np.flatnonzero(ds["removed"].sel(fold=f, criterion=crit, k=k).values).tolist()
                assert len(layers) == k and 0 not in layers and L - 1 not in layers  # protect = ends
                held = np.flatnonzero(folds == 1 - f)
                got = ds["seq_loss"].sel(criterion=crit, k=k).values[held]
                np.testing.assert_allclose(got, _seq_loss_without(model, toks[held], layers), atol=2e-6)


def test_choices_recounted_on_the_calibration_windows(setup):
    """skip_loss, greedy, block_influence, causal and permutation pick what plain loops over the calibration
    windows pick; the causal and permutation scores over all windows are the datasets' own."""
    _, model, data, causal, perm, ds = setup
    folds = ds["seq_fold"].values
    allowed = range(1, L - 1)
    for f in (0, 1):
        cal = np.flatnonzero(folds == f)
        toks = data.tokens[cal]

        def loss(s, toks=toks):
            return float(_seq_loss_without(model, toks, list(s)).mean())

        single = {l: loss([l]) for l in allowed}
        greedy: list[int] = []
        for k in (1, 2, 3):
            skip = sorted(sorted(allowed, key=lambda l: (single[l], l))[:k])
            assert np.flatnonzero(ds["removed"].sel(fold=f, criterion="skip_loss", k=k).values).tolist() == skip
            greedy.append(min((l for l in allowed if l not in greedy), key=lambda l: (loss(greedy + [l]), l)))
            assert np.flatnonzero(ds["removed"].sel(fold=f, criterion="greedy", k=k).values).tolist() == sorted(greedy)
            assert float(ds["calibration_loss"].sel(fold=f, criterion="greedy", k=k)) == pytest.approx(
                loss(greedy), abs=2e-6
            )
        # causal: Σ seq_sum / Σ seq_count over the calibration windows, mean over t > s
        ss = causal["seq_sum"].sel(variant="current").values
        sc = causal["seq_count"].sel(variant="current").values
        effect = {}
        for s in allowed:
            vals = [ss[s, t, cal].sum() / sc[s, t, cal].sum() for t in range(s + 1, L)]
            effect[s] = np.mean(vals)
        for k in (1, 2, 3):
            want = sorted(sorted(effect, key=lambda l: (effect[l], l))[:k])
            assert np.flatnonzero(ds["removed"].sel(fold=f, criterion="causal", k=k).values).tolist() == want
    everyone = np.arange(data.n_seq)
    mde = causal["mean_downstream_effect"].sel(variant="current", aggregator="mean").values
    np.testing.assert_allclose(_causal_effect(causal, everyone, L)[: L - 1], mde[: L - 1], rtol=1e-6)
    np.testing.assert_allclose(_perm_importance(perm, everyone, L), permutation_importance(perm), rtol=1e-9)


def test_pairwise_model_predicts_from_measured_singles_and_pairs(setup):
    """δ and γ are the measured calibration losses; the prediction of a pool pair is then exact on calibration."""
    _, model, data, _, _, ds = setup
    folds = ds["seq_fold"].values
    for f in (0, 1):
        toks = data.tokens[np.flatnonzero(folds == f)]
        clean = float(_seq_loss_without(model, toks, []).mean())
        g = ds["pair_gamma"].values[f]
        pool = sorted({i for i in range(L) for j in range(L) if np.isfinite(g[i, j])})
        assert len(pool) == 3
        for i, j in itertools.combinations(pool, 2):
            di = float(_seq_loss_without(model, toks, [i]).mean()) - clean
            dj = float(_seq_loss_without(model, toks, [j]).mean()) - clean
            dij = float(_seq_loss_without(model, toks, [i, j]).mean()) - clean
            assert g[i, j] == pytest.approx(dij - di - dj, abs=2e-6)
    m = PairwiseModel({1: 0.1, 2: 0.2, 3: 0.05}, {(1, 2): -0.25}, [1, 2])
    assert m.predict([1, 2]) == pytest.approx(0.05) and m.predict([1, 2], additive=True) == pytest.approx(0.3)
    assert m.search(2, [1, 2, 3]) == [1, 2]  # the interaction makes the pair cheaper than the two smallest δ
    err = prediction_error(ds)
    assert err["all"]["n"] == len(err["cuts"]) > 3
    maes = np.mean([abs(c["pairwise"] - c["measured"]) for c in err["cuts"]])
    assert err["all"]["pairwise"]["mae"] == pytest.approx(maes)


def test_random_baselines(setup):
    _, model, data, _, _, _ = setup
    r = random_baselines(model, data, k_max=3, n_random=20, seed=1)
    strat = r["removed"].sel(baseline="random_stratified").values
    assert strat[..., 0].sum() == 0 and strat[..., L - 1].sum() == 0  # the criteria's policy
    uni = r["removed"].sel(baseline="random_uniform").values
    assert uni[..., 0].sum() > 0  # uniform over all layers: the first layer is drawn at times
    for k in (1, 2, 3):
        assert (uni[k].sum(-1) == k).all() and (strat[k].sum(-1) == k).all()
    for b, k, d in ((0, 2, 0), (1, 3, 5)):
        layers = np.flatnonzero(r["removed"].values[b, k, d]).tolist()
        np.testing.assert_allclose(
            r["seq_loss"].values[b, k, d], _seq_loss_without(model, data.tokens, layers), atol=2e-6
        )


def test_wins_and_ties_recounted_by_plain_loops(setup):
    """summarize's best criterion, ties (the same cut in both folds) and wins against loops over the dataset."""
    _, model, data, _, _, ds = setup
    r = random_baselines(model, data, k_max=3, n_random=3, seed=0)
    s = summarize(ds, r, n_boot=200)
    crits = [str(c) for c in ds["criterion"].values]
    assert set(s["scopes"]) == {"pooled", "english", "code"}
    for scope, summ in s["scopes"].items():
        ix = [i for i, d in enumerate(ds["domain"].values) if scope in ("pooled", str(d))]
        wins = {c: 0 for c in crits}
        for k in (1, 2, 3):
            means = {}
            for c in crits:
                tot = 0.0
                for i in ix:
                    tot += float(ds["seq_loss"].sel(criterion=c, k=k).values[i])
                means[c] = tot / len(ix)
            best = min(crits, key=lambda c: (means[c], crits.index(c)))
            tied = []
            for c in crits:
                same = True
                for f in (0, 1):
                    a = ds["removed"].sel(fold=f, criterion=c, k=k).values.tolist()
                    b = ds["removed"].sel(fold=f, criterion=best, k=k).values.tolist()
                    same = same and a == b
                if same:
                    tied.append(c)
                    wins[c] += 1
            row = summ["rows"][k - 1]
            assert row["best"] == best and sorted(row["tied"]) == sorted(tied)
            for c, iv in row["vs_best"].items():
                assert iv["low"] <= iv["estimate"] <= iv["high"] and "paired" in iv["method"]
                assert iv["estimate"] == pytest.approx(means[c] - means[best])
            assert row["random"]["random_uniform"]["min"] <= row["random"]["random_uniform"]["mean"]
        assert summ["wins"] == wins


def test_upper_bound_is_the_one_sided_t_bound():
    from scipy import stats

    d = np.array([0.1, 0.3, 0.2, 0.4])
    want = d.mean() + stats.t.ppf(0.95, 3) * d.std(ddof=1) / 2
    assert upper_bound(d) == pytest.approx(want)
    assert upper_bound(np.array([0.1])) == float("inf")


def test_bad_options(setup):
    _, model, data, _, _, _ = setup
    with pytest.raises(DepthlensError, match="unknown pruning criteria"):
        heldout_curves(model, data, criteria=("magic",))
    with pytest.raises(DepthlensError, match="k_max"):
        heldout_curves(model, data, k_max=L - 1)  # only L - 2 layers may go under protect = ends
    with pytest.raises(DepthlensError, match="domain labels"):
        heldout_curves(model, data, domains=["a"], k_max=1, criteria=("skip_loss",))
    with pytest.raises(DepthlensError, match="protect"):
        heldout_curves(model, data, k_max=1, criteria=("skip_loss",), protect="middle")


def test_window_domains_of_the_offline_corpus(tmp_path, monkeypatch):
    """Each window of the byte-level corpus is labelled with the kind of the document its middle token is in,
    checked against the decoded text: the window's middle 24 characters occur in a document of that kind."""
    import json

    from depthlens.runtime.evaldata import default_corpus_dir, load_eval_data

    data = load_eval_data(None, "bytes", n_seq=12, seq_len=96, seed=0)
    doms = window_domains(data)
    assert doms is not None and set(doms) == {"english", "code"}
    directory = default_corpus_dir(__import__("depthlens.data.tokenizers", fromlist=["x"]).get_tokenizer("bytes"))
    sources = [s for s in json.loads((directory / "manifest.json").read_text())["sources"] if s["split"] == "val"]
    from depthlens.data.corpus import code_sources, english_sources

    by_name = {s.name: s for s in english_sources() + code_sources()}
    texts = {"english": "", "code": ""}
    for s in sources:
        texts[s["kind"]] += by_name[s["name"]].read().decode("utf-8")[: s["bytes_used"]] + "\n"
    for row, dom in zip(data.tokens.numpy(), doms):
        body = bytes(int(t) for t in row[1:] if t < 256).decode("utf-8", errors="ignore")
        mid = body[len(body) // 2 - 12 : len(body) // 2 + 12]
        assert mid in texts[dom], (dom, mid)
    assert window_domains(EvalData.from_tokens(data.tokens)) is None  # not the corpus's windows: unknown


def test_window_domains_without_a_bos(tmp_path, monkeypatch):
    """A tokenizer without BOS packs documents with no delimiter (SmolLM2's GGUF tokenizer): each document's
    length is recounted by tokenizing the packaged sources again; checked against the decoded windows."""
    import json

    from depthlens.data.corpus import build_corpus, code_sources, english_sources
    from depthlens.data.tokenizers import ByteTokenizer
    from depthlens.runtime import evaldata

    class NoBos(ByteTokenizer):
        name = "bytes-nobos"
        bos_id = None

    tok = NoBos()
    corpus = tmp_path / "corpus"
    build_corpus(corpus, tok, max_bytes=400_000)
    monkeypatch.setattr(evaldata, "default_corpus_dir", lambda t, max_bytes=0: corpus)
    data = evaldata.load_eval_data(None, tok, n_seq=12, seq_len=64, seed=0)
    assert not data.bos
    doms = window_domains(data, tok)
    assert doms is not None and set(doms) == {"english", "code"}
    assert window_domains(data) is None  # no BOS and no tokenizer: unknown, never guessed
    by_name = {s.name: s for s in english_sources() + code_sources()}
    texts = {"english": "", "code": ""}
    for s in json.loads((corpus / "manifest.json").read_text())["sources"]:
        if s["split"] == "val":
            texts[s["kind"]] += by_name[s["name"]].read()[: s["bytes_used"]].decode("utf-8") + "\n"
    for row, dom in zip(data.tokens.numpy(), doms):
        body = bytes(int(t) for t in row if t < 256).decode("utf-8", errors="ignore")
        mid = body[len(body) // 2 - 10 : len(body) // 2 + 10]
        assert mid in texts[dom], (dom, mid)

"""The atlas's lens section ("Where the prediction forms", scripts/atlas.py) against its own datasets.

* the committed atlas: every model's *forms at* (trained and twin, logit and tuned lens) recounted by loops from
  the per-sequence agreement stored in `reports/atlas/<model>/data/*_lens.nc`, and the page quotes them;
* the committed lens data of all three real models is there (four stages each) and its summaries recount in
  NumPy from the stored per-position values (means, medians, interval widths, the final boundary);
* with the GGUF files (`real_models`; skipped where they are absent, as in CI): the stored per-position KL and
  target rank of the logit and tuned lens recomputed independently, from the Hugging Face model's own layers
  (forward hooks), norm and unembedding and, for the tuned lens, the cached translators, with KL and rank in
  float64 NumPy;
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
REAL = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct")  # the atlas's three models
Z95 = 1.959963984540054  # the two-sided 95 % normal quantile


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


def _stage(name: str, stage: str) -> xr.Dataset:
    with xr.open_dataset(ATLAS / name / "data" / f"{stage}.nc") as ds:
        return ds.load()


def _present(name: str) -> list[str]:
    return [st for st in STAGES if (ATLAS / name / "data" / f"{st}.nc").is_file()]


@pytest.mark.parametrize("name", REAL)
def test_every_real_model_has_its_lens_stages_committed(name):
    """Each of the three models has the trained logit and tuned lens (a twin stage not run yet is named on the
    page), each stage in atlas.json with its cost, all read on one set of eval tokens (trained and twin paired on
    the same sequences), the tuned ones with the training budget lens_run.json records."""
    doc = json.loads((ATLAS / "atlas.json").read_text())
    (s,) = [m for m in doc["models"] if m["name"] == name]
    run = json.loads((ATLAS / name / "data" / "lens_run.json").read_text())
    present = _present(name)
    assert {"logit_lens", "tuned_lens"} <= set(present), (name, present)
    assert set(present) == set(s["lens"]) & set(STAGES)
    tokens = {stage: _stage(name, stage)["eval_tokens"].values for stage in present}
    for stage, toks in tokens.items():
        assert run["stages"][stage]["cpu_s"] > 0 and s["lens"]["costs"][stage] == run["stages"][stage]
        assert toks.shape == (run["options"]["n_seq"], run["options"]["seq_len"])
        assert np.array_equal(toks, tokens["logit_lens"]), (name, stage)
    for stage in set(present) & {"tuned_lens", "untrained_tuned_lens"}:
        ds = _stage(name, stage)
        assert int(ds.attrs["train_steps"]) == run["options"]["steps"] == ds.sizes["train_step"]
        assert int(ds.attrs["train_tokens_per_step"]) == run["options"]["tokens_per_step"]
        assert str(ds.attrs["train_split"]).endswith("/train") and str(ds.attrs["eval_data"]).endswith("/val")
    missing = [st for st in STAGES if st not in present]
    page = (ATLAS / "README.md").read_text()
    assert not missing or f"{name}: {', '.join(missing)}" in page  # what is not there is said


@pytest.mark.parametrize("name", REAL)
def test_committed_lens_summaries_recount_from_the_per_position_values(name):
    """Plain NumPy over the stored per-position values of every committed stage: the per-sequence position mean
    of KL and median of the rank, their sequence means, each interval's half-width against z · sd / sqrt(N) of
    the per-sequence values (a bootstrap SE of a mean; 1000 resamples, so within 10 %), and the final boundary
    (KL 0, agreement 1)."""
    for stage in _present(name):
        _recount(_stage(name, stage), f"{name} {stage}")


def _recount(ds: xr.Dataset, what: str) -> None:
    kl, rank = ds["lens_kl_tok"].values.astype(np.float64), ds["target_rank_tok"].values.astype(np.float64)
    L = int(ds.attrs["n_layer"])
    assert kl.shape[0] == rank.shape[0] == L + 1 and kl.shape[2] == ds["eval_tokens"].shape[1] - 2, what
    assert np.all(kl >= -1e-4) and np.all(rank >= 0), what
    n_seq = kl.shape[1]
    kl_seq = np.array([[sum(kl[l, i]) / kl.shape[2] for i in range(n_seq)] for l in range(L + 1)])
    rank_seq = np.array([[np.median(rank[l, i]) for i in range(n_seq)] for l in range(L + 1)])
    np.testing.assert_allclose(ds["lens_kl_seq"].values, kl_seq, rtol=1e-5, atol=1e-6, err_msg=what)
    np.testing.assert_allclose(ds["lens_kl"].values, kl_seq.mean(1), rtol=1e-5, atol=1e-6, err_msg=what)
    np.testing.assert_array_equal(ds["target_rank_seq"].values, rank_seq, err_msg=what)
    np.testing.assert_allclose(ds["target_rank"].values, rank_seq.mean(1), rtol=1e-12, err_msg=what)
    assert np.all(kl[L] == 0) and np.all(ds["top1_agree_seq"].values[L] == 1), what  # the final boundary
    assert np.all((ds["top1_agree_seq"].values >= 0) & (ds["top1_agree_seq"].values <= 1)), what
    for var in ("lens_kl", "target_rank", "lens_ce", "top1_agree"):
        seq, ci = ds[f"{var}_seq"].values, ds[f"{var}_ci"].values
        assert ds[f"{var}_ci"].attrs["ci_method"] == "normal interval with bootstrap standard error", what
        half = Z95 * seq.std(axis=1) / np.sqrt(n_seq)  # the bootstrap SE of a mean: sd (ddof 0) / sqrt(N)
        est = seq.mean(1)
        assert np.all(ci[:, 0] <= est + 1e-12) and np.all(est <= ci[:, 1] + 1e-12), (what, var)
        hi_bound = 1.0 if var == "top1_agree" else np.inf
        free = (ci[:, 0] > 0.0) & (ci[:, 1] < hi_bound)  # neither side clipped to the variable's range
        np.testing.assert_allclose(
            (ci[free, 1] - ci[free, 0]) / 2, half[free], rtol=0.1, atol=1e-9, err_msg=f"{what} {var}"
        )
    f, lo, hi = float(ds["forms_depth"]), float(ds["forms_depth_low"]), float(ds["forms_depth_high"])
    assert f == pytest.approx(_forms_by_loops(ds), nan_ok=True), what
    assert np.isnan(f) or (0 <= lo <= f <= hi <= 1), what


@pytest.fixture(scope="module", params=REAL)
def hf_states(request):
    """One eval sequence of the committed lens data through the GGUF model's Hugging Face module: the residual
    at every layer boundary (the input of layer 0, then each decoder layer's output, by forward hooks) and the
    HF forward's own logits, at a few positions."""
    import torch

    from depthlens.data.real_models import model_path

    name = request.param
    path = model_path(name)
    if not path.is_file():
        pytest.skip(f"{path} not fetched (bash scripts/fetch-real-models.sh {name}); CI has no GGUF files")
    from depthlens.adapters.load import open_model

    hf = open_model(path).model.hf
    toks = torch.as_tensor(_stage(name, "logit_lens")["eval_tokens"].values[:1].astype(np.int64))
    states: list = []

    def pre(mod, args, kwargs):
        if not states:
            states.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    def post(mod, args, kwargs, out):
        states.append((out[0] if isinstance(out, tuple) else out).detach().clone())

    layers = hf.model.layers
    hooks = [layers[0].register_forward_pre_hook(pre, with_kwargs=True)]
    hooks += [layer.register_forward_hook(post, with_kwargs=True) for layer in layers]
    try:
        with torch.no_grad():
            logits = hf(toks[:, :-1], use_cache=False).logits.double().numpy()[0]  # the last token: a target only
    finally:
        for h in hooks:
            h.remove()
    assert len(states) == len(layers) + 1
    pos = np.linspace(1, toks.shape[1] - 2, 8).round().astype(int)  # stored positions 1..T-2
    return {
        "name": name,
        "hf": hf,
        "pos": pos,
        "targets": toks[0, pos + 1].numpy(),
        "states": [s[0, pos].float() for s in states],
        "logits": logits[pos],
    }


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


@pytest.mark.real_models
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["logit_lens", "tuned_lens"])
def test_committed_lens_recomputed_through_hf_in_numpy(hf_states, stage):
    """The stored per-position KL(p_L ‖ q_l) and target rank at every boundary equal an independent computation:
    HF's own residual stream, final norm and unembedding (checked against the HF forward's logits at l = L), the
    tuned lens's translators h + A_l h + c_l read from the cache the run wrote, KL and rank in float64 NumPy."""
    import torch

    from depthlens.diagnostics.lens.engine import lens_cache_dir

    name, hf, pos = hf_states["name"], hf_states["hf"], hf_states["pos"]
    ds = _stage(name, stage)
    L = len(hf_states["states"]) - 1
    A = c = None
    if stage == "tuned_lens":
        key = ds.attrs["cache_key"]
        path = lens_cache_dir() / f"{key}.pt"
        if not path.is_file():
            pytest.skip(f"the translators of this run are not in the cache ({path})")
        blob = torch.load(path, map_location="cpu", weights_only=True)
        A, c = blob["weight"].double().numpy(), blob["bias"].double().numpy()
        assert A.shape[0] == L
    W = hf.get_output_embeddings().weight.detach().double().numpy()
    cap = getattr(hf.config, "final_logit_softcapping", None)

    def readout(l: int) -> np.ndarray:
        h = hf_states["states"][l]
        if A is not None and c is not None and l < L:
            x = h.double().numpy()
            h = torch.as_tensor(x + x @ A[l].T + c[l]).float()
        with torch.no_grad():
            z = hf.model.norm(h[None])[0].double().numpy() @ W.T
        return cap * np.tanh(z / cap) if cap else z

    final = readout(L)
    scale = max(1.0, float(np.abs(hf_states["logits"]).max()))
    assert np.abs(final - hf_states["logits"]).max() <= 2e-4 * scale  # the readout at L is the model's output
    logp = _log_softmax(final)
    rows = np.arange(len(pos))
    kl_tok, rank_tok = ds["lens_kl_tok"].values[:, 0, pos - 1], ds["target_rank_tok"].values[:, 0, pos - 1]
    for l in range(L + 1):
        z = readout(l)
        kl = (np.exp(logp) * (logp - _log_softmax(z))).sum(-1)
        rank = (z > z[rows, hf_states["targets"]][:, None]).sum(-1)
        np.testing.assert_allclose(kl_tok[l], kl, rtol=2e-3, atol=2e-3, err_msg=f"{name} {stage} l={l}")
        assert np.abs(rank_tok[l] - rank).max() <= 1, (name, stage, l, rank_tok[l], rank)


def test_atlas_lens_section_from_a_tiny_model(tmp_path):
    import depthlens
    from depthlens.diagnostics.lens.engine import lens_readout
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

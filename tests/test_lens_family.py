"""The lens family (diagnostics/lens/engine.py): the logit lens and the tuned lens, against independent computations.

* the logit lens's KL, target rank, top-1 agreement and CE re-derived in NumPy from the hook cache;
* the tuned lens at init (translators 0) equals the logit lens exactly; training lowers KL on held-out data;
* the reference package (`tuned-lens` 0.2.0) gives the same lens logits and the same training steps on shared
  weights (skipped when it is not installed);
* the readout of an untrained model is shown and differs from the trained one;
* native, Hugging Face (a tiny LlamaForCausalLM) and GGUF models; the chunked head equals whole logits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from depthlens.adapters.hf import wrap
from depthlens.diagnostics import registry
from depthlens.diagnostics.lens.engine import (
    Optimizer,
    Readout,
    TrainOptions,
    Translators,
    boundary_states,
    clip_grad_norm,
    forms_at_depth,
    lens_readout,
    train_step,
)
from depthlens.errors import DataError, DepthlensError
from depthlens.runtime.evaldata import load_eval_data, random_eval_data
from gguf_tiny import tiny_llama, write_tiny_gguf
from helpers import debug_model

EVAL = (4, 20, 0)  # the `data` fixture: 4 random sequences of 20 tokens over 97 ids, BOS 96
VARS = ("lens_kl", "target_rank", "top1_agree", "lens_ce", "lens_kl_tok", "target_rank_tok")


def _np_log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def _numpy_lens(states: list[np.ndarray], gamma: np.ndarray, eps: float, W: np.ndarray, targets: np.ndarray):
    """Per boundary: KL(p_L || q_l), rank, agreement, CE in float64 from h_l (N, P, d) (RMSNorm, then W)."""

    def logp(h):
        g = gamma * h / np.sqrt((h**2).mean(-1, keepdims=True) + eps)
        return _np_log_softmax(g @ W.T)

    lp_final = logp(states[-1])
    top_final = lp_final.argmax(-1)
    out = []
    for h in states:
        lq = logp(h)
        kl = (np.exp(lp_final) * (lp_final - lq)).sum(-1)
        zt = np.take_along_axis(lq, targets[..., None], -1)
        rank = (lq > zt).sum(-1)
        out.append({"kl": kl, "rank": rank, "agree": lq.argmax(-1) == top_final, "ce": -zt[..., 0], "lq": lq, "zt": zt})
    return out


def test_logit_lens_matches_numpy(data):
    m = debug_model("preln", n_layer=4, seed=1)
    ds = lens_readout(m, data, kind="logit", batch_size=3, n_boot=200)
    run = data.tokens[:, :-1]
    _, cache = m.run_with_cache(run)
    hooks = [f"blocks.{l}.hook_resid_pre" for l in range(4)] + ["hook_resid_final"]
    states = [cache[k][:, 1:].double().numpy() for k in hooks]  # positions 1..T-2
    targets = data.tokens[:, 2:].numpy()
    ref = _numpy_lens(
        states, m.norm.weight.double().detach().numpy(), m.norm.eps, m.lm_head.weight.double().detach().numpy(), targets
    )
    for l, r in enumerate(ref):
        np.testing.assert_allclose(ds["lens_kl_tok"].values[l], r["kl"], rtol=1e-4, atol=2e-6)
        np.testing.assert_allclose(ds["lens_kl_seq"].values[l], r["kl"].mean(-1), rtol=1e-4, atol=2e-6)
        np.testing.assert_allclose(ds["lens_ce_seq"].values[l], r["ce"].mean(-1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(ds["top1_agree_seq"].values[l], r["agree"].mean(-1))
        # the rank is exact wherever no other token's log-prob lies within 1e-5 of the target's (float32 head)
        near = (np.abs(r["lq"] - r["zt"]) < 1e-5).sum(-1) > 1
        got = ds["target_rank_tok"].values[l]
        assert near.mean() < 0.05 and (got[~near] == r["rank"][~near]).all()
        np.testing.assert_allclose(ds["target_rank_seq"].values[l], np.median(got, -1))
    assert ds["lens_kl"].values[-1] == 0 and ds["top1_agree"].values[-1] == 1  # boundary L is the model itself
    np.testing.assert_allclose(ds["depth"].values, np.arange(5) / 4)
    # the intervals: each layer's bootstrap interval over sequences holds its mean and names its method
    lo, hi = ds["lens_kl_ci"].values.T
    assert (lo <= ds["lens_kl"].values + 1e-12).all() and (ds["lens_kl"].values <= hi + 1e-12).all()
    assert ds["lens_kl_ci"].attrs["ci_method"] and ds["lens_kl_ci"].attrs["ci_unit"] == "eval sequences"
    # where the prediction forms: the first l/L whose mean top-1 agreement exceeds 0.5, from the NumPy agreement
    agree = np.array([r["agree"].mean(-1).mean() for r in ref])
    want = (np.arange(5) / 4)[int(np.argmax(agree > 0.5))]
    assert float(ds["forms_depth"]) == want == forms_at_depth(ds["top1_agree_seq"].values, ds["depth"].values, 0.5)
    assert ds["forms_depth_low"] <= ds["forms_depth"] <= ds["forms_depth_high"]


def test_logit_lens_on_every_design_reads_the_models_own_output(data):
    """At boundary L the lens is the model's own head (KL 0, agreement 1, CE = the model's loss) on every design."""
    for arch in ("hc", "mhc", "full_attnres", "block_attnres", "deepnorm", "moda"):
        m = debug_model(arch, n_layer=4, seed=0)
        ds = lens_readout(m, data, kind="logit", n_boot=0)
        with torch.no_grad():
            logits = m(data.tokens[:, :-1])[:, 1:].double()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), data.tokens[:, 2:].reshape(-1))
        assert ds["lens_kl"].values[-1] == 0 and ds["top1_agree"].values[-1] == 1, arch
        assert ds["lens_ce"].values[-1] == pytest.approx(float(ce), rel=1e-5), arch
        assert np.isfinite(ds["lens_kl"].values).all() and (ds["lens_kl"].values[:-1] > 0).all(), arch


def test_tuned_lens_at_init_is_the_logit_lens(data):
    m = debug_model("hc", n_layer=4, seed=2)
    a = lens_readout(m, data, kind="logit", n_boot=50)
    b = lens_readout(m, data, kind="tuned", translators=Translators(4, m.config.d_model), n_boot=50)
    for v in VARS + ("forms_depth",):
        np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=v)
    assert b.attrs["kind"] == "tuned" and b.attrs["train_split"] == "translators given"


@pytest.fixture(scope="module")
def zoo():
    """The trained zoo checkpoint preln_l4 (byte vocabulary) and held-out eval data (the corpus's val split)."""
    from depthlens.io.checkpoint import load

    ck = load("checkpoints/preln_l4")
    return ck.model, load_eval_data(None, "bytes", n_seq=8, seq_len=64, seed=0)


def test_training_lowers_kl_on_held_out_data(zoo, tmp_path):
    model, data = zoo
    opts = dict(steps=60, tokens_per_step=128, train_n_seq=16, n_boot=100, cache=tmp_path)
    logit = lens_readout(model, data, kind="logit", n_boot=100)
    tuned = lens_readout(model, data, kind="tuned", checkpoint="checkpoints/preln_l4", **opts)
    assert tuned.attrs["train_split"].startswith("corpus-bytes/train")  # trained on train, evaluated on val
    assert tuned.attrs["cache"] == "miss" and tuned["train_loss"].values[-10:].mean() < tuned["train_loss"].values[0]
    kl_l, kl_t = logit["lens_kl"].values[:-1], tuned["lens_kl"].values[:-1]
    assert (kl_t < kl_l).all(), (kl_t, kl_l)  # every boundary before the last, on the held-out val sequences
    # the cache: the same model, data and options load the same translators; another option trains anew
    again = lens_readout(model, data, kind="tuned", checkpoint="checkpoints/preln_l4", **opts)
    assert again.attrs["cache"] == "hit" and again.attrs["cache_key"] == tuned.attrs["cache_key"]
    np.testing.assert_array_equal(again["lens_kl_tok"].values, tuned["lens_kl_tok"].values)
    other = lens_readout(model, data, kind="tuned", checkpoint="checkpoints/preln_l4", **{**opts, "steps": 2})
    assert other.attrs["cache"] == "miss" and other.attrs["cache_key"] != tuned.attrs["cache_key"]


def test_trains_under_no_grad_as_the_study_runs_it(data):
    m = debug_model("preln", n_layer=2, seed=0)
    train = random_eval_data(97, n_seq=4, seq_len=20, seed=5, bos_id=96)
    with torch.no_grad():  # studies/study.py runs every engine under no_grad
        ds = lens_readout(m, data, kind="tuned", train_data=train, steps=3, cache=False, n_boot=0)
    assert ds["train_loss"].size == 3 and np.isfinite(ds["train_loss"].values).all()


def test_eval_sequences_in_the_training_split_are_refused(zoo, tmp_path):
    model, data = zoo
    with pytest.raises(DataError, match="shares sequences"):
        lens_readout(model, data, kind="tuned", train_data=data, steps=1, cache=False)


def test_untrained_twin_readout_is_shown_and_differs(zoo):
    from depthlens.adapters.twin import untrained_twin

    model, data = zoo
    trained = lens_readout(model, data, kind="logit", n_boot=200)
    twin = lens_readout(untrained_twin(model, seed=0), data, kind="logit", n_boot=200)
    assert twin["top1_agree"].values[-1] == 1 and np.isfinite(twin["lens_kl"].values).all()
    # the trained model's last-layer loss is far below the twin's (log 257 at init), beyond both intervals
    assert trained["lens_ce_ci"].values[-1, 1] < twin["lens_ce_ci"].values[-1, 0]
    assert not np.allclose(trained["lens_kl"].values, twin["lens_kl"].values, rtol=0.05)


def test_optimizer_is_torchs_sgd_nesterov_and_adam_with_the_linear_schedule():
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(0)
    for name in ("sgd", "adam"):
        o = TrainOptions(steps=7, optimizer=name)
        a, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(3, 4))
        b.data.copy_(a.data)
        mine = Optimizer([a], o)
        cls = torch.optim.SGD if name == "sgd" else torch.optim.Adam
        kw = dict(momentum=0.9, nesterov=True) if name == "sgd" else dict(betas=(0.9, 0.999))
        ref = cls([b], lr=o.learning_rate, weight_decay=o.weight_decay, **kw)
        warm = 0 if name == "sgd" else 7 // 5
        sched = get_linear_schedule_with_warmup(ref, warm, 7 - warm)  # as tuned_lens's create_scheduler calls it
        for _ in range(7):
            g = torch.randn(3, 4)
            a.grad, b.grad = g.clone(), g.clone()
            clip_grad_norm([a], 1.0)
            torch.nn.utils.clip_grad_norm_([b], 1.0)
            mine.step()
            ref.step()
            sched.step()
            torch.testing.assert_close(a.data, b.data, rtol=1e-6, atol=1e-7)


def _reference_optimizer_defaults(tl) -> dict:
    """The defaults of the reference's `Optimizer` (tuned_lens/scripts/ingredients.py), read from its source: the
    module cannot be imported beside torchdata >= 0.10 (it imports `torchdata.dataloader2`, since removed)."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(tl.__file__).parent / "scripts" / "ingredients.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Optimizer")
    out = {}
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            out[st.target.id] = (
                ast.literal_eval(st.value) if isinstance(st.value, ast.Constant) else ast.unparse(st.value)
            )
    return {k: out[k] for k in ("weight_decay", "lr_scale", "momentum", "optimizer")}


def test_reference_package_agrees_on_shared_weights(monkeypatch):
    tl = pytest.importorskip("tuned_lens")
    # its model surgery asks `isinstance(model, transformer_lens.HookedTransformer)`, a name TransformerLens 4
    # removed (ImportError): treat it as absent, as the package does when TransformerLens is not installed
    monkeypatch.setattr("tuned_lens.model_surgery._transformer_lens_available", False)
    from transformers import get_linear_schedule_with_warmup

    hf = tiny_llama(seed=3, n_layer=3)
    model = wrap(hf)
    L, d = 3, hf.config.hidden_size
    toks = random_eval_data(hf.config.vocab_size, n_seq=2, seq_len=12, seed=1, bos_id=1).tokens
    ref = tl.TunedLens.from_model(hf, bias=True)
    mine = Translators(L, d)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for l in range(L):
            ref[l].weight.copy_(0.05 * torch.randn(d, d, generator=g))
            ref[l].bias.copy_(0.05 * torch.randn(d, generator=g))
            mine.weight[l].copy_(ref[l].weight)
            mine.bias[l].copy_(ref[l].bias)
    # the hidden states: ours are HF's hidden_states[l] for l < L (positions 1..T-2 of tokens[:, :T-1])
    with torch.no_grad():
        out = hf(toks[:, :-1], output_hidden_states=True)
        ours = boundary_states(model, toks)
    for l in range(L):
        torch.testing.assert_close(ours[l], out.hidden_states[l][:, 1:], rtol=1e-5, atol=1e-5)
    readout = Readout(model)
    with torch.no_grad():
        torch.testing.assert_close(readout.logits(ours[L]), out.logits[:, 1:], rtol=1e-5, atol=1e-5)
        for l in range(L):  # the lens forward: ref(h, idx) = unembed(h + translator(h))
            torch.testing.assert_close(readout.logits(mine(ours[l], l)), ref(ours[l], idx=l), rtol=1e-5, atol=1e-5)
    # three training steps on the same rows: the reference's loss (train_loop.py: KL against the final
    # log-probs, each layer's own backward, in float32 here), its optimiser (ingredients.Optimizer defaults: SGD,
    # Nesterov 0.9, lr 1.0 x 0.1, weight decay 1e-3, linear decay over the steps) and clipping, against ours
    hs = torch.stack([h.reshape(-1, d) for h in ours[:L]])  # (L, 20, d)
    hL = ours[L].reshape(-1, d)
    d0 = _reference_optimizer_defaults(tl)
    assert d0 == {"weight_decay": 1e-3, "lr_scale": 1.0, "momentum": 0.9, "optimizer": "OptimizerOption.SGD"}
    ref_opt = torch.optim.SGD(  # ingredients.Optimizer.create_optim for SGD, as written there
        list(ref.layer_translators.parameters()),
        lr=d0["lr_scale"] * (1 - d0["momentum"]),
        momentum=d0["momentum"],
        nesterov=True,
        weight_decay=d0["weight_decay"],
    )
    ref_sched = get_linear_schedule_with_warmup(ref_opt, 0, 3)  # create_scheduler: no warm-up for SGD
    opt = Optimizer(list(mine.parameters()), TrainOptions(steps=3))
    for _ in range(3):
        with torch.no_grad():
            labels = ref.unembed(hL).float().log_softmax(-1)
        for l in range(L):
            logits = ref(hs[l], idx=l)
            loss = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=False)
        ref_sched.step()
        train_step(readout, mine, opt, hs, hL)
        for l in range(L):
            torch.testing.assert_close(mine.weight[l], ref[l].weight.data, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(mine.bias[l], ref[l].bias.data, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(mine.weight, torch.zeros_like(mine.weight))


def test_on_hf_and_gguf_models_and_whole_logits_equal_the_chunked_head(tmp_path):
    from depthlens.adapters.load import open_model

    hf = tiny_llama(seed=0)
    data = random_eval_data(hf.config.vocab_size, n_seq=3, seq_len=16, seed=2, bos_id=1)
    a = lens_readout(wrap(hf), data, kind="logit", n_boot=0)
    gguf = open_model(write_tiny_gguf(hf, tmp_path / "t.F32.gguf")).model
    b = lens_readout(gguf, data, kind="logit", n_boot=0)
    assert a.attrs["head_path"] == "vocab-chunked"
    for v in ("lens_kl", "top1_agree", "lens_ce"):
        np.testing.assert_allclose(a[v].values, b[v].values, rtol=1e-4, atol=1e-5, err_msg=v)

    class WholeHead:  # the same model without an Unembedding: the head is only callable whole
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            if name == "unembedding":
                raise AttributeError(name)
            return getattr(self._inner, name)

    c = lens_readout(WholeHead(wrap(hf)), data, kind="logit", n_boot=0)
    assert c.attrs["head_path"] == "whole-logits"
    for v in ("lens_kl_tok", "lens_ce", "top1_agree", "target_rank_tok"):
        np.testing.assert_allclose(a[v].values, c[v].values, rtol=1e-4, atol=2e-5, err_msg=v)
    t = lens_readout(
        wrap(hf),
        data,
        kind="tuned",
        train_data=random_eval_data(hf.config.vocab_size, 8, 16, 9, 1),
        steps=5,
        cache=False,
        n_boot=0,
    )
    assert t.attrs["cache"] == "off" and np.isfinite(t["lens_kl"].values).all()


def test_bad_options_are_one_line_errors(data):
    m = debug_model("preln", n_layer=2)
    with pytest.raises(DepthlensError, match="kind must be one of"):
        lens_readout(m, data, kind="tuning")
    with pytest.raises(DepthlensError, match="forms_at"):
        lens_readout(m, data, forms_at=1.5)
    with pytest.raises(DepthlensError, match="optimizer must be one of"):
        lens_readout(m, data, kind="tuned", optimizer="lbfgs", train_data=data.tokens[:, :5] + 0, cache=False)


def test_registry_and_cli(tmp_path):
    from depthlens.cli.app import app

    assert registry.get("logitlens").name == "logit_lens" and registry.get("tuned_lens").loaded().view
    out = tmp_path / "ll.nc"
    r = CliRunner().invoke(
        app, ["logit_lens", "checkpoints/preln_l4", "--n-seq", "4", "--seq-len", "32", "--out", str(out), "--json"]
    )
    assert r.exit_code == 0, r.output
    head = json.loads(r.stdout)
    assert head["metric"] == "logit_lens" and 0 <= head["forms"] <= 1 and len(head["by_layer"]["lens_kl"]) == 5
    import xarray as xr

    ds = xr.load_dataset(out)
    assert float(ds["forms_depth"]) == head["forms"] and ds["layer"].size == 5
    r = CliRunner().invoke(app, ["tuned_lens", "checkpoints/preln_l4", "--n-seq", "4", "--opt", "optimizer=bfgs"])
    assert r.exit_code != 0 and "optimizer must be one of" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["logit_lens", "checkpoints/preln_l4", "--n-seq", "4", "--opt", "stepz=3"])
    assert r.exit_code != 0 and "unknown lens option 'stepz'" in r.output and "Traceback" not in r.output

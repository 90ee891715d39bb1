"""Hooks that cannot lie (models/hook_contract.py).

* Every hook point of a native model (residual views, attention internals, norm scales, MLP, embedding, streams),
  of the hand-mapped HF adapter and of the generic-blocks path: a hook that returns a wrong shape (broadcastable
  ones included: (B, 1, ...), (1, T, ...), (last,), a (..., 1) scale widened), a wrong dtype or a non-tensor
  raises one HookError that names the hook point, the expected and the given shape.
* A read-only residual view (HC, mHC, Full/Block AttnRes) refuses an edit, in place or returned, and points to the
  hook points that do write back; reading it (or returning it unchanged) is allowed and changes nothing.
* An in-place edit on an editable hook point flows into the result (it is not lost either).
"""

from __future__ import annotations

import pytest
import torch

from depthlens.models import ModelConfig, build_model
from depthlens.models.hook_contract import HookError, check_hook_value
from helpers import tiny_hf

torch.set_num_threads(1)
B, T = 2, 5


def _model(arch: str):
    return build_model(ModelConfig.debug(arch, n_layer=2, n_kv_head=2), seed=3).eval()


def _toks(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(0))


def _bad_values(x: torch.Tensor) -> list[tuple[str, object]]:
    """Return values that must be refused in place of `x` (each paired with a label)."""
    out: list[tuple[str, object]] = [
        ("float64", x.double()),
        ("float16", x.half()),
        ("list", x.tolist()),
        ("number", 1.0),
        ("numpy", x.detach().numpy()),
        ("extra dim", x.unsqueeze(0)),
    ]
    if x.shape[0] > 1:
        out.append(("(1, ...)", x[:1]))
    if x.dim() >= 2 and x.shape[1] > 1:
        out.append(("(B, 1, ...)", x[:, :1]))
    if x.dim() >= 2:
        out.append(("(last,)", x.reshape(-1, x.shape[-1])[0]))
    if x.shape[-1] > 1:
        out.append(("wrong width", x[..., :-1]))
    else:
        out.append(("(..., 1) widened", x.expand(*x.shape[:-1], 4)))
    return out


def _scale_in_place(x, hook):  # edits the hook's tensor and returns None (the edit alone)
    x.mul_(1.5).add_(0.1)


def _assert_refused(model, toks, name: str, value_of) -> None:
    seen: dict[str, tuple] = {}

    def hook(x, hook):
        seen["shape"] = tuple(x.shape)
        return value_of(x)

    with pytest.raises(HookError) as e, torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[(name, hook)])
    msg = str(e.value)
    assert "\n" not in msg and name in msg and str(seen["shape"]) in msg, msg


NATIVE = {
    "preln": None,
    "hc": "blocks.1.hook_streams_pre",
    "full_attnres": None,
    "moda": None,
}


@pytest.mark.parametrize("arch", list(NATIVE))
def test_every_hook_point_of_a_native_model_refuses_wrong_values(arch):
    model = _model(arch)
    toks = _toks(model.config.vocab_size)
    names = [n for n in model.hook_dict if not n.startswith("blocks.0.")]  # layer 1 and the global ones
    assert {"blocks.1.hook_resid_post", "blocks.1.attn.hook_pattern", "blocks.1.mlp.hook_post"} <= set(names)
    if arch != "full_attnres":
        assert "blocks.1.ln1.hook_scale" in names
    if NATIVE[arch]:
        assert NATIVE[arch] in names
    with torch.no_grad():
        plain = model(toks)
    for name in names:
        probe: list[torch.Tensor] = []
        with torch.no_grad():
            model.run_with_hooks(toks, fwd_hooks=[(name, lambda x, hook, p=probe: p.append(x.clone()))])
        for label, _ in _bad_values(probe[0]):
            if label in ("float16", "numpy", "extra dim") and arch != "preln":
                continue  # the same path as float64 / list / (1, ...): once is enough

            def value_of(x, label=label):
                return dict(_bad_values(x))[label]

            _assert_refused(model, toks, name, value_of)
    with torch.no_grad():  # nothing left attached, and the forward unchanged
        assert torch.equal(model(toks), plain)


def test_the_cases_of_the_report_name_the_hook_and_both_shapes():
    model = _model("preln")
    toks = _toks(model.config.vocab_size)
    d = model.config.d_model
    for name, value_of, expected, given in [
        ("blocks.1.hook_resid_post", lambda x: x[:, :1], (B, T, d), (B, 1, d)),
        ("blocks.1.hook_resid_post", lambda x: x[:1], (B, T, d), (1, T, d)),
        ("blocks.1.hook_resid_post", lambda x: x[0, 0], (B, T, d), (d,)),
        ("blocks.1.ln1.hook_scale", lambda x: x.expand(B, T, d), (B, T, 1), (B, T, d)),
        ("blocks.1.hook_resid_post", lambda x: x[..., :-1], (B, T, d), (B, T, d - 1)),
    ]:
        with pytest.raises(HookError) as e, torch.no_grad():
            model.run_with_hooks(toks, fwd_hooks=[(name, lambda x, hook, f=value_of: f(x))])
        msg = str(e.value)
        assert f"a hook on {name} returned shape {given}" in msg and f"exactly the shape {expected}" in msg, msg
    for value, what in (([1.0], "a list"), (3, "a int"), ("x", "a str")):
        with pytest.raises(HookError, match=f"blocks.1.hook_resid_post returned {what};"), torch.no_grad():
            model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook, v=value: v)])


@pytest.mark.parametrize(
    ("arch", "editable"),
    [
        ("hc", "hook_streams_*"),
        ("mhc", "hook_streams_*"),
        ("full_attnres", "hook_attn_in / hook_mlp_in"),
        ("block_attnres", "hook_attn_in / hook_mlp_in"),
    ],
)
def test_a_read_only_view_refuses_edits_in_place_and_returned(arch, editable):
    model = _model(arch)
    assert not model.design.editable_view
    toks = _toks(model.config.vocab_size)
    with torch.no_grad():
        plain = model(toks)
    for site in ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.0.hook_resid_post"):
        for how, edit in (
            ("in place", lambda x, hook: x.zero_()),
            ("in place", _scale_in_place),
            ("by returning another value", lambda x, hook: x * 2),
        ):
            with pytest.raises(HookError) as e, torch.no_grad():
                model.run_with_hooks(toks, fwd_hooks=[(site, edit)])
            msg = str(e.value)
            assert "\n" not in msg and site in msg and "read-only" in msg and how in msg and editable in msg, msg
        reads: list[torch.Tensor] = []
        with torch.no_grad():  # reading it, or handing back what came in (or an equal copy), is fine
            for read in (lambda x, hook, r=reads: r.append(x.sum()), lambda x, hook: x, lambda x, hook: x.clone()):
                assert torch.equal(model.run_with_hooks(toks, fwd_hooks=[(site, read)]), plain)
        assert len(reads) == 1


@pytest.mark.parametrize(
    "site",
    [
        "blocks.1.hook_resid_pre",
        "blocks.1.hook_attn_in",
        "blocks.1.attn.hook_q",
        "blocks.1.attn.hook_z",
        "blocks.1.attn.hook_pattern",
        "blocks.1.ln1.hook_scale",
        "blocks.1.ln2.hook_normalized",
        "blocks.1.mlp.hook_post",
        "blocks.1.hook_mlp_out",
        "hook_embed",
        "hook_resid_final",
    ],
)
def test_an_in_place_edit_of_an_editable_hook_point_flows(site):
    model = _model("preln")
    toks = _toks(model.config.vocab_size)
    with torch.no_grad():
        plain = model(toks)
        edited = model.run_with_hooks(toks, fwd_hooks=[(site, _scale_in_place)])
        returned = model.run_with_hooks(toks, fwd_hooks=[(site, lambda x, hook: x * 1.5 + 0.1)])
    assert (edited - plain).abs().max() > 1e-5  # a debug model: small weights, small but real changes
    torch.testing.assert_close(edited, returned, rtol=1e-6, atol=1e-6)


def test_streams_of_a_multi_stream_design_stay_editable():
    model = _model("hc")
    toks = _toks(model.config.vocab_size)
    with torch.no_grad():
        plain = model(toks)
        edited = model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_streams_pre", lambda x, hook: x.mul_(1.5))])
    assert (edited - plain).abs().max() > 1e-4


@pytest.mark.parametrize("path", ["hand-mapped", "generic-blocks"])
def test_adapted_models_refuse_wrong_values_too(path):
    from depthlens.adapters.generic import GenericBlocksModel
    from depthlens.adapters.hf import HFLayeredModel

    hf = tiny_hf("llama")
    model = HFLayeredModel(hf) if path == "hand-mapped" else GenericBlocksModel(hf)
    toks = _toks(61)
    names = [n for n in model.hook_dict if not n.startswith("blocks.0.")]
    assert "blocks.1.hook_resid_post" in names and "hook_embed" in names
    with torch.no_grad():
        plain = model(toks)
    for name in names:
        for label in ("float64", "list", "(B, 1, ...)", "(1, ...)", "(last,)", "wrong width"):
            _assert_refused(model, toks, name, lambda x, label=label: dict(_bad_values(x))[label])
        with torch.no_grad():
            edited = model.run_with_hooks(toks, fwd_hooks=[(name, _scale_in_place)])
        assert (edited - plain).abs().max() > 1e-5, name
    with torch.no_grad():
        assert torch.equal(model(toks), plain)


def test_check_hook_value_accepts_exactly_the_replaced_tensor():
    x = torch.zeros(2, 3)
    check_hook_value(None, torch.ones(2, 3), x.shape, x.dtype, x.device)
    for bad in (torch.ones(3, 2), torch.ones(2, 3, dtype=torch.float64), torch.ones(6), None, [0.0]):
        with pytest.raises(HookError, match="an unnamed hook point returned"):
            check_hook_value(None, bad, x.shape, x.dtype, x.device)


def test_a_branch_input_edited_in_place_under_autograd_is_refused_not_leaked_into_the_residual():
    model = _model("preln")
    toks = _toks(model.config.vocab_size)
    with pytest.raises(HookError, match="edited blocks.1.hook_attn_in in place.*return the edited tensor"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_attn_in", _scale_in_place)])
    out = model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_attn_in", lambda x, hook: x * 1.5 + 0.1)])
    with torch.no_grad():  # the returned edit is what the no-grad in-place edit does
        torch.testing.assert_close(
            out, model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_attn_in", _scale_in_place)]), rtol=0, atol=1e-6
        )


def test_read_only_views_under_inference_mode():
    model = _model("hc")
    toks = _toks(model.config.vocab_size)
    with torch.inference_mode():
        plain = model(toks)
        assert torch.equal(
            model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x)]), plain
        )
        with pytest.raises(HookError, match="read-only.*in place"):
            model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_pre", _scale_in_place)])


def test_a_backward_hook_on_a_read_only_view_is_refused_not_silently_idle():
    model = _model("full_attnres")
    toks = _toks(model.config.vocab_size)
    with pytest.raises(HookError, match="read-only view .* no gradient flows through it"):
        model.run_with_hooks(toks, bwd_hooks=[("blocks.1.hook_resid_pre", lambda g, hook: None)])
    assert not model.blocks[1].hook_resid_pre._backward_hooks  # run_with_hooks removed it again

"""The vocabulary-chunked head (depthlens.diagnostics.vocab) against whole logits in float64, and the paths that
use it: the permutation score's loss and KL, the Unembedding split of every model's head, and the CPU row rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthlens.designs import SLUGS
from depthlens.diagnostics import vocab
from depthlens.diagnostics.permutation.engine import permutation_scores
from depthlens.models.protocol import unembedding_of
from depthlens.runtime.evaldata import EvalData, cpu_tokens_per_batch, default_rows, random_eval_data
from helpers import debug_model


def _case(R=37, d=16, V=1000, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(R, d, generator=g)
    W = torch.randn(V, d, generator=g) * 0.7
    b = torch.randn(V, generator=g) if bias else None
    t = torch.randint(0, V, (R,), generator=g)
    return h, W, b, t


@pytest.mark.parametrize("R,V,chunk", [(37, 1000, 256), (3, 257, 256), (600, 5000, None), (5, 999, 1)])
def test_logsumexp_and_target_equal_float64_logits(R, V, chunk):
    """Chunk sizes that do not divide V, one chunk per vocabulary row, the default rule."""
    h, W, b, t = _case(R=R, V=V)
    lse, zt = vocab.logsumexp_and_target(h, W, b, t, chunk=chunk)
    z = F.linear(h.double(), W.double(), b.double())
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(z, -1).numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(zt.numpy(), z.gather(1, t[:, None])[:, 0].numpy(), rtol=0, atol=2e-5)
    assert lse.dtype == zt.dtype == torch.float32


def test_masked_vocabulary_chunk_is_not_nan():
    """A whole chunk of −inf logits (a masked vocabulary range) contributes 0, not NaN."""
    h, W, _, t = _case(R=4, V=600)
    b = torch.zeros(600)
    b[:300] = -float("inf")
    t = torch.full((4,), 450)
    lse, zt = vocab.logsumexp_and_target(h, W, b, t, chunk=256)  # chunk 0 is all −inf, chunk 1 partly
    z = F.linear(h.double(), W.double(), b.double())
    assert torch.isfinite(lse).all()
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(z, -1).numpy(), atol=2e-5)


def test_bf16_hidden_reduces_in_float32():
    """bf16 weights and hidden: the matmul runs in bf16, every reduction in float32 (NLL ≥ 0, lse finite)."""
    h, W, b, t = _case(R=64, V=4000, bias=False)
    lse, zt = vocab.logsumexp_and_target(h.bfloat16(), W.bfloat16(), None, t)
    z = F.linear(h.bfloat16(), W.bfloat16()).float()  # the same bf16 products, reduced in float32
    assert lse.dtype == torch.float32
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(z, -1).numpy(), atol=1e-4)
    assert (lse - zt >= 0).all()


def test_expected_embedding_equals_softmax_times_weight():
    h, W, b, _ = _case(R=50, V=3000)
    z = F.linear(h.double(), W.double(), b.double())
    lse = torch.logsumexp(z, -1)
    pw, total = vocab.expected_embedding(h, W, b, lse.float(), chunk=700)
    p = torch.softmax(z, -1)
    np.testing.assert_allclose(pw.numpy(), (p @ W.double()).numpy(), atol=1e-5)
    np.testing.assert_allclose(total.numpy(), 1.0, atol=1e-5)


@pytest.mark.parametrize("arch", SLUGS)
def test_unembedding_is_the_head(arch):
    """Every native design offers an Unembedding, and F.linear(hidden, W, b) is its head exactly."""
    m = debug_model(arch, 3)
    toks = torch.randint(0, m.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ctx = m.context(9)
        state = m.run_layers(m.embed(toks, ctx), ctx)
        u = unembedding_of(m)
        assert u is not None
        torch.testing.assert_close(F.linear(u.hidden(state, ctx), u.weight, u.bias), m.head(state, ctx), rtol=0, atol=0)


def _numpy_loss(logits_ref: np.ndarray, logits: np.ndarray, targets: np.ndarray):
    """NLL and KL(p_ref ‖ p) per token from float64 logits (b, T', V): the definitions, written out."""

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lp = log_softmax(logits_ref), log_softmax(logits)
    nll = -np.take_along_axis(lp, targets[..., None], -1)[..., 0]
    kl = (np.exp(lr) * (lr - lp)).sum(-1)
    return nll, kl


@pytest.mark.parametrize("chunked", [True, False])
def test_loss_against_reference_equals_numpy(chunked):
    """Both paths (vocabulary chunks; whole logits) give the NumPy float64 NLL and KL, for a state of 3 blocks
    of the b sequences; the reference itself gives exactly ΔNLL = 0 and KL = 0."""
    m = debug_model("preln", 3, vocab_size=1500)
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, 1500, (2, 10), generator=g)
    with torch.no_grad():
        ctx = m.context(9)
        clean = m.run_layers(m.embed(toks[:, :-1], ctx), ctx)
        arms = [m.run_layers(m.embed(toks[:, :-1], ctx), ctx, order=o) for o in ([1, 0, 2], [0, 2, 1])]
        state = {k: torch.cat([clean[k]] + [a[k] for a in arms]) for k in clean}  # (3·b, T−1, d)
        loss = vocab.LossAgainstReference(m, ctx, toks, chunked=chunked)
        assert loss.chunked is chunked
        nll0 = loss.reference(clean)
        nll, kl = loss(state)
        ref_logits = m.head(clean, ctx)[:, 1:].double().numpy()
        want = [
            _numpy_loss(ref_logits, m.head(s, ctx)[:, 1:].double().numpy(), toks[:, 2:].numpy()) for s in (clean, *arms)
        ]
    np.testing.assert_allclose(nll0.numpy(), want[0][0], atol=2e-5)
    np.testing.assert_allclose(nll.numpy(), np.concatenate([w[0] for w in want]), atol=2e-5)
    np.testing.assert_allclose(kl.numpy(), np.concatenate([w[1] for w in want]), atol=2e-5)
    assert (nll[:2] == nll0).all() and (kl[:2] == 0).all()  # the reference against itself: exactly zero
    assert (kl[2:] > 1e-4).all()  # and the swaps do move the distribution


def test_permutation_chunked_equals_whole_logits_and_records_the_path():
    m = debug_model("hc", 4, vocab_size=3000)
    data = random_eval_data(3000, n_seq=3, seq_len=12, seed=0, bos_id=0)
    a = permutation_scores(m, data, pairs="all", batch_size=5)
    b = permutation_scores(m, data, pairs="all", batch_size=5, chunked_head=False)
    for v in ("perm_abs", "perm_kl", "clean_loss", "delta_loss_seq", "kl_seq"):
        np.testing.assert_allclose(a[v].values, b[v].values, rtol=0, atol=1e-6)
    assert a.attrs["head_path"] == "vocab-chunked" and b.attrs["head_path"] == "whole-logits"


def test_model_without_unembedding_takes_the_whole_logits_path():
    """A model that does not offer an Unembedding (e.g. a soft-capped head) is never chunked, even when asked,
    and gets the chunked run's numbers through its whole logits."""
    m = debug_model("preln", 3, vocab_size=1200)

    class NoSplit:  # the same model, minus the split head
        def __getattr__(self, name):
            return getattr(m, name)

        unembedding = None

    data = random_eval_data(1200, n_seq=2, seq_len=10, seed=1, bos_id=0)
    whole = permutation_scores(NoSplit(), data, pairs="all", chunked_head=True)
    chunked = permutation_scores(m, data, pairs="all")
    assert unembedding_of(NoSplit()) is None
    assert (whole.attrs["head_path"], chunked.attrs["head_path"]) == ("whole-logits", "vocab-chunked")
    for v in ("perm_abs", "perm_kl", "clean_loss"):
        np.testing.assert_allclose(whole[v].values, chunked[v].values, rtol=0, atol=1e-6)


def test_cpu_rows_follow_the_cache_rule(monkeypatch):
    """Rows per forward on the CPU: LLC / (4 B × params per layer / d), clamped to [256, 4096] tokens."""
    m = debug_model("preln", 4)
    data = EvalData.from_tokens(torch.zeros(2, 16, dtype=torch.long))
    per_token = sum(p.numel() for p in m.parameters()) / 4 / m.config.d_model
    monkeypatch.setattr("depthlens.runtime.evaldata.last_level_cache_bytes", lambda default=0: 1 << 20)
    want = int(min(4096, max(256, (1 << 20) / (4 * per_token))))
    assert cpu_tokens_per_batch(m) == want and default_rows(data, m) == want // 16
    monkeypatch.setattr("depthlens.runtime.evaldata.last_level_cache_bytes", lambda default=0: 1 << 40)
    assert default_rows(data, m) == 4096 // 16  # capped
    assert default_rows(data) == 4096 // 16 and default_rows(data, m, tokens_per_batch=64) == 4  # explicit wins


def test_chunk_size_rule():
    """CPU: a (rows, C) float32 block of ≈ 2 MiB (248 rows of SmolLM2 → 2048, the measured best); accelerators:
    256 MiB blocks (few launches); always a multiple of 256 within [256, V]."""
    assert vocab.chunk_size(248, 49152) == 2048
    assert vocab.chunk_size(4096, 49152) == 256 and vocab.chunk_size(1, 300) == 300
    assert vocab.chunk_size(4096, 49152, "cuda") == 16384 and vocab.chunk_size(4096, 49152, "cuda:1") == 16384

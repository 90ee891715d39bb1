"""A user's mHC LM (Xie et al. 2025, Eq. 7-9) in plain PyTorch: no package on the index implements mHC faithfully
(lucidrains' `ManifoldConstrainedHyperConnections` normalises each stream on its own and projects it on its own,
where Eq. 7 normalises and projects the n streams flattened together), so this is what a user writes from the paper.

State: x (B, T, n, d), row = stream. Per sublayer: x' = RMSNorm(vec x) (no gain); H_pre = σ(α_pre x'φ_pre + b_pre),
H_post = 2σ(α_post x'φ_post + b_post), H_res = Sinkhorn(exp(α_res mat(x'φ_res) + b_res)) (row = destination);
x ← H_res x + H_post^T F(H_pre x). Identity-biased init (H_res ≈ I). Nothing here knows depthlens.
"""

from __future__ import annotations

import math

import torch
from tiny_llama import Attention, PreNorm, SwiGLU, train
from torch import nn

import depthlens


class MHC(nn.Module):
    """One mHC sublayer around `branch` (the branch has its own pre-norm)."""

    def __init__(self, d: int, n: int, branch: nn.Module, sinkhorn_iters: int = 20, eps: float = 1e-6):
        super().__init__()
        self.n, self.iters, self.eps, self.branch = n, sinkhorn_iters, eps, branch
        self.phi = nn.Parameter(torch.randn(n * d, n * n + 2 * n) * 1e-2)  # [φ_pre | φ_post | φ_res]
        bias = torch.cat([torch.full((n,), -math.log(n - 1)), torch.zeros(n), 5.0 * (torch.eye(n) - 1).flatten()])
        self.bias = nn.Parameter(bias)  # H_pre = 1/n, H_post = 1, H_res ≈ I
        self.alpha = nn.Parameter(torch.full((3,), 0.01))  # α_pre, α_post, α_res

    def maps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.n
        flat = x.flatten(-2)
        z = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps) @ self.phi
        pre = torch.sigmoid(self.alpha[0] * z[..., :n] + self.bias[:n])
        post = 2 * torch.sigmoid(self.alpha[1] * z[..., n : 2 * n] + self.bias[n : 2 * n])
        logits = (self.alpha[2] * z[..., 2 * n :] + self.bias[2 * n :]).unflatten(-1, (n, n))
        res = torch.exp(logits - logits.amax((-2, -1), keepdim=True))
        for _ in range(self.iters):  # Sinkhorn-Knopp: columns, then rows
            res = res / res.sum(-2, keepdim=True)
            res = res / res.sum(-1, keepdim=True)
        return pre, post, res

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, n, d) -> (B, T, n, d)
        pre, post, res = self.maps(x)
        y = self.branch((pre.unsqueeze(-1) * x).sum(-2))
        return res @ x + post.unsqueeze(-1) * y.unsqueeze(-2)


class MHCBlock(nn.Module):
    def __init__(self, d: int, n_head: int, d_ff: int, n: int):
        super().__init__()
        self.attn = MHC(d, n, PreNorm(d, Attention(d, n_head)))
        self.mlp = MHC(d, n, PreNorm(d, SwiGLU(d, d_ff)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class MHCModel(nn.Module):
    def __init__(
        self, vocab: int = 257, d: int = 32, n_layer: int = 4, n_head: int = 4, d_ff: int = 96, streams: int = 4
    ):
        super().__init__()
        self.streams = streams
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(MHCBlock(d, n_head, d_ff, streams) for _ in range(n_layer))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).unsqueeze(-2).expand(-1, -1, self.streams, -1)  # n copies of h_0
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x.sum(-2)))


# --- the adapter: what depthlens needs to know about this model (docs/own-model.md#worked-adapters) ----------


def describe(model: MHCModel | None = None):
    """depthlens's view of `model`: state x (B, T, n, d); a block is one layer; its writers are the two branches."""
    model = MHCModel() if model is None else model  # the CLI calls describe() and loads --weights into it
    seen = {}
    for block in model.blocks:
        for sub in (block.attn, block.mlp):
            sub.register_forward_pre_hook(lambda m, args: seen.__setitem__(m, args[0]))

    def maps(sub):  # the model's own maps at the input it last saw (H_res with row = destination, as depthlens)
        pre, post, res = sub.maps(seen[sub])
        return {"pre": pre, "post": post, "res_map": res}

    return depthlens.wrap(
        model,
        embed=lambda tokens: model.embed(tokens)[:, :, None].repeat(1, 1, model.streams, 1),
        blocks=model.blocks,
        head=lambda x: model.lm_head(model.norm(x.sum(2))),
        view=lambda x: x.sum(2),
        sublayers=lambda block: (block.attn.branch, block.mlp.branch),
        mixing=lambda block: [maps(block.attn), maps(block.mlp)] if block is not None else {},
        design="mhc-user",
    )


# python examples/mhc_model.py OUT.safetensors: train a few steps with this plain mHC, save
if __name__ == "__main__":
    import sys

    from safetensors.torch import save_model

    torch.manual_seed(0)
    model = MHCModel()
    print("losses", train(model, model.embed.num_embeddings, steps=5, lr=1e-2))
    save_model(model, sys.argv[1])

"""DepthModel: the shared backbone with a pluggable residual design, hook points and interventions.

Shapes: B batch, T positions, d width, V vocab, L layers, n streams (HC/mHC).

    tokens (B, T) --embed--> h0 (B, T, d) --design.init_state--> state
    for l in 0..L-1:  state = blocks[l](state)          # attention router+body, then MLP router+body
    h_L = design.final(state) --norm--> --lm_head--> logits (B, T, V)

Interventions the diagnostics need live here, in batched form: `run_layers` starts from any cached state
(prefix reuse), takes per-layer keep masks (skip a layer on a set of positions, per batch row), and runs
the layers in any order (`swap="body"` keeps routing parameters in place, `swap="all"` moves them too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .backbone import NormHooks, RMSNorm, Sublayer, rope_tables
from .config import ModelConfig
from .hook_contract import fire, fire_read_only
from .lens_root import LensRoot, hook_point
from .protocol import LayerLoop, LayerStep, Unembedding
from .readouts import Readouts, readout_key
from .residual import design_for
from .residual.base import Design, RunContext, State, SublayerCall


class Block(nn.Module):
    """One layer: body (two sublayers, which move with a `body` swap) and routers (which do not)."""

    def __init__(self, cfg: ModelConfig, design: Design, layer: int):
        super().__init__()
        self.layer = layer
        self.attn = design.make_sublayer("attn")
        self.mlp = design.make_sublayer("mlp")
        self.router_attn = design.make_router(2 * layer)
        self.router_mlp = design.make_router(2 * layer + 1)
        # hook points (TransformerLens names). resid_* show the design's residual view (B, T, d).
        self.hook_resid_pre = hook_point()
        self.hook_resid_mid = hook_point()
        self.hook_resid_post = hook_point()
        self.hook_attn_in = hook_point()  # the attention branch input (B, T, d), before its pre-norm
        self.hook_attn_out = hook_point()  # raw attention branch output F_j (B, T, d)
        self.hook_mlp_in = hook_point()
        self.hook_mlp_out = hook_point()
        # norm sites (TransformerLens `ln1`/`ln2`: the branch pre-norms; `ln*_post`: Sandwich's branch post-norms).
        # DeepNorm has no branch pre-norm (its norm is the trunk's, seen at hook_resid_mid/post): no ln1/ln2.
        self.ln1 = NormHooks() if design.branch_prenorm else None
        self.ln2 = NormHooks() if design.branch_prenorm else None
        self.ln1_post = NormHooks() if design.post_norm_on_branch() else None
        self.ln2_post = NormHooks() if design.post_norm_on_branch() else None
        if design.multi_stream:
            self.hook_streams_pre = hook_point()  # (B, T, n, d), editable
            self.hook_streams_post = hook_point()

    def forward(
        self,
        state: State,
        *,
        design: Design,
        pos: int,
        ctx: RunContext,
        body: Block | None = None,
        router: Block | None = None,
        keep_attn: torch.Tensor | None = None,
        keep_mlp: torch.Tensor | None = None,
    ) -> tuple[State, torch.Tensor]:
        """Run layer position `pos`. Hooks are this (positional) block's; body/router may come from others.

        Returns the new state and the layer's update u_l (docs/concepts.md#notation).
        """
        body = body or self
        router = router or self
        state = self._hook_view(self.hook_resid_pre, state, design, "pre")

        def branch(
            sub: Sublayer,
            hooks: Sublayer,
            hook_in: nn.Module,
            hook_out: nn.Module,
            ln: NormHooks | None,
            ln_post: NormHooks | None,
        ) -> Callable[..., torch.Tensor]:
            def run(x: torch.Tensor, **kw: Any) -> torch.Tensor:
                y = sub(fire(hook_in, x, copy=True), ctx.cos, ctx.sin, hooks=hooks, ln=ln, ln_post=ln_post, **kw)
                return fire(hook_out, y)

            return run

        attn = SublayerCall(
            branch(body.attn, self.attn, self.hook_attn_in, self.hook_attn_out, self.ln1, self.ln1_post),
            body.attn,
            j=2 * pos,
            pos=pos,
            ctx=ctx,
            keep=keep_attn,
        )
        state, carry = router.router_attn(state, attn)
        state = self._hook_view(self.hook_resid_mid, state, design, None)
        mlp = SublayerCall(
            branch(body.mlp, self.mlp, self.hook_mlp_in, self.hook_mlp_out, self.ln2, self.ln2_post),
            body.mlp,
            j=2 * pos + 1,
            pos=pos,
            ctx=ctx,
            keep=keep_mlp,
            carry=carry,
        )
        state, carry = router.router_mlp(state, mlp)
        state = self._hook_view(self.hook_resid_post, state, design, "post")
        return state, carry

    def _hook_view(self, hook: nn.Module, state: State, design: Design, streams: str | None) -> State:
        if streams is not None and design.multi_stream:
            state = design.set_streams(state, fire(getattr(self, f"hook_streams_{streams}"), design.streams(state)))
        view = design.view(state)
        if not design.editable_view:  # a hook may read the view; an edit, in place or returned, raises
            editable = "hook_attn_in / hook_mlp_in" + (" or hook_streams_*" if design.multi_stream else "")
            fire_read_only(hook, view, f"design {design.slug!r}: {design.view_name}", editable)
            return state
        out = fire(hook, view)
        return state if out is view else design.set_view(state, out)


class DepthModel(LayerLoop, LensRoot):
    """LLaMA-like decoder with one of ten residual designs; a TransformerLens `HookedRootModule` from the first
    use of that surface (hooks, run_with_cache, hook_dict, cfg: `models.lens_root`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        config = config.resolved()
        self.config = config
        self.design = design_for(config)
        d, V = config.d_model, config.vocab_size
        self.embed_tokens = nn.Embedding(V, d)
        self.hook_embed = hook_point()
        self.blocks = nn.ModuleList([Block(config, self.design, l) for l in range(config.n_layer)])
        self.final_router = self.design.make_final_router()
        self.hook_resid_final = hook_point()  # h_L before the final norm (B, T, d)
        use_final_norm = not (config.arch == "deepnorm" and not config.deepnorm_final_norm)
        final_norm = RMSNorm(d, config.norm_eps) if use_final_norm else None
        self.norm = final_norm if final_norm is not None else nn.Identity()
        self.ln_final = NormHooks(final_norm) if final_norm is not None else None  # TransformerLens' final norm
        self.lm_head = nn.Linear(d, V, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._init_weights()
        self.tokenizer: Any = None  # set by depthlens.load for a checkpoint that carries one (Lens.to_tokens)
        self.lens_ready()

    def _blocks(self) -> list[Block]:
        """`blocks` with its element type (nn.ModuleList's items are untyped)."""
        return [b for b in self.blocks if isinstance(b, Block)]

    def lens_config(self) -> Any:
        """The TransformerLens config (`cfg`), built when transformer-lens is first asked for."""
        return _lens_config(self.config)

    # ------------------------------------------------------------------------------------------------
    def _init_weights(self) -> None:
        std = self.config.init_std
        nn.init.normal_(self.embed_tokens.weight, std=std)
        if not self.config.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=std)
        for blk in self._blocks():
            for sub in (blk.attn, blk.mlp):
                for m in sub.fn.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.normal_(m.weight, std=std)
        self.design.init_weights(self)

    @property
    def n_layer(self) -> int:
        return self.config.n_layer

    # --- the pieces of a forward pass ------------------------------------------------------------------
    def context(self, seq_len: int, *, record: bool = False, device: torch.device | None = None) -> RunContext:
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds the model's max_seq_len {self.config.max_seq_len}")
        device = device or self.lm_head.weight.device
        cos, sin = rope_tables(self.config, seq_len, device=device)
        return RunContext(cos=cos, sin=sin, record={} if record else None)

    def embed(self, tokens: torch.Tensor, ctx: RunContext) -> State:
        """tokens (B, T) -> the design's initial state."""
        h0 = fire(self.hook_embed, self.embed_tokens(tokens))  # (B, T, d)
        ctx.put("h0", h0)
        return self.design.init_state(h0)

    def run_position(self, state: State, ctx: RunContext, step: LayerStep) -> tuple[State, torch.Tensor | None]:
        """Block `step.pos` with the body (and with swap="all" the routers) of block `step.src`."""
        body = self.blocks[step.src]
        router = body if step.swap == "all" else None
        keep = {"keep_attn": step.keep_attn, "keep_mlp": step.keep_mlp}
        return self.blocks[step.pos](state, design=self.design, pos=step.pos, ctx=ctx, body=body, router=router, **keep)

    def final_hidden(self, state: State, ctx: RunContext) -> torch.Tensor:
        """h_L (B, T, d) before the final norm."""
        return fire(self.hook_resid_final, self.design.final(state, self.final_router, ctx))

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm (B, T, d) -> (B, T, d), through the `ln_final` hook points."""
        return self.norm(h) if self.ln_final is None else self.norm(h, hooks=self.ln_final)

    def head(self, state: State, ctx: RunContext) -> torch.Tensor:
        """state after the last layer -> logits (B, T, V)."""
        return self.lm_head(self.final_norm(self.final_hidden(state, ctx)))

    def unembedding(self) -> Unembedding:
        """The head as `norm(final_hidden)` then `lm_head` (no bias, no logit transform): see `Unembedding`."""
        return Unembedding(
            hidden=lambda state, ctx: self.final_norm(self.final_hidden(state, ctx)),
            weight=self.lm_head.weight,
            bias=None,
        )

    def forward(self, tokens: torch.Tensor, **run_kw: Any) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V). Extra keywords go to `run_layers` (keep, order, swap...)."""
        ctx = self.context(tokens.shape[1])
        return self.head(self.run_layers(self.embed(tokens, ctx), ctx, **run_kw), ctx)

    # --- readouts ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def readouts(self, tokens: torch.Tensor) -> Readouts:
        """One forward recording every router's mixing object (per token where dynamic).

        Keys are `models.readouts.readout_key(name, sublayer=j)` = `sub{j}.<name>` for sublayer j (2l attention,
        2l+1 MLP), plus `h0`, `final.*`, and the static readouts `static.sub{j}.<name>`.
        """
        ctx = self.context(tokens.shape[1], record=True)
        self.head(self.run_layers(self.embed(tokens, ctx), ctx), ctx)
        rec = Readouts(ctx.record or {})
        for l, blk in enumerate(self._blocks()):
            for j, r in ((2 * l, blk.router_attn), (2 * l + 1, blk.router_mlp)):
                for k, v in r.readout().items():
                    rec[readout_key(k, j, static=True)] = v
        final_readout = getattr(self.final_router, "readout", None)  # AttnRes' final operator has one
        if final_readout is not None:
            for k, v in final_readout().items():
                rec[readout_key(k, static=True, final=True)] = v
        return rec

    @torch.no_grad()
    def depth_mixing(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """M[i -> j] per token: (B, T, 2L+1 sources, 2L+1 destinations); see Design.depth_mixing."""
        return self.design.depth_mixing(self.readouts(tokens), self.config.n_sublayer)

    def hook_names(self) -> list[str]:
        return list(self.hook_dict)

    @contextlib.contextmanager
    def eval_mode(self):
        """Temporarily switch to eval() (no dropout exists, but keep the contract explicit)."""
        was = self.training
        self.eval()
        try:
            yield self
        finally:
            self.train(was)


def _lens_config(cfg: ModelConfig) -> Any:
    """A TransformerLens config: what ActivationCache/patching helpers read (sizes, GQA heads, RMS norms, SwiGLU)."""
    from transformer_lens.config import TransformerLensConfig

    return TransformerLensConfig(
        d_model=cfg.d_model,
        d_head=cfg.head_dim,
        n_layers=cfg.n_layer,
        n_ctx=cfg.max_seq_len,
        n_heads=cfg.n_head,
        n_key_value_heads=cfg.kv_heads,
        d_mlp=cfg.ffn_dim,
        d_vocab=cfg.vocab_size,
        act_fn="silu",
        gated_mlp=True,
        normalization_type="RMS",
        uses_rms_norm=True,
        final_rms=True,
        eps=cfg.norm_eps,
        positional_embedding_type="rotary",
        device="cpu",
    )


def build_model(config: ModelConfig, seed: int | None = 0) -> DepthModel:
    """Build a model with a seeded init (identical across runs and machines for the same seed)."""
    if seed is None:
        return DepthModel(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DepthModel(config)

"""TransformerLens interop: depthlens models as TransformerLens models, and TransformerBridge models as
depthlens models.

Both `DepthModel` and `HFLayeredModel` are `HookedRootModule`s with TransformerLens hook names
(`blocks.{i}.hook_resid_pre|mid|post`, ...) and a `cfg`, so `run_with_hooks` and
`transformer_lens.patching` work on them directly. What TransformerLens' structural `TransformerLensModel`
protocol adds is `to_tokens`, and `run_with_cache` returning an `ActivationCache` (HookedRootModule returns
a plain dict). `Lens` adds exactly those two, as a thin wrapper (the model class is not edited):

    lens = Lens.from_pretrained("checkpoints/hc_l16")     # any path open_model takes; its tokenizer comes along
    lens = Lens(model, tokenizer)                         # model: DepthModel | HFLayeredModel
    logits, cache = lens.run_with_cache(lens.to_tokens("text"))   # cache: transformer_lens.ActivationCache
    cache.accumulated_resid()                             # (L+1, B, T, d): h_0 .. h_L (pre final norm)
    patching.get_act_patch_resid_pre(lens, corrupt, cache, metric)   # (L, T)

The cache's LN-scaled stacks (`apply_ln_to_stack`, and `accumulated_resid`/`decompose_resid` with
`apply_ln=True`) divide a residual-view stack by the scale a norm measured. That means what it says only where
the norm reads the residual view (Pre-LN, LNS, Sandwich, KEEL, MoDA; the final norm also under DeepNorm and
the HC/mHC sum collapse); elsewhere the cache refuses in one line instead of returning a plausible number.

The other direction: `from_bridge(bridge)` wraps the HF model inside a TransformerLens `TransformerBridge`
with the depthlens adapter, so every depthlens diagnostic runs on a bridge someone already built.

Hooks are global state on a HookedRootModule; everything here goes through `hooks()`/`run_with_*`, which
remove what they add. `attached_hooks(model)` lists leftovers (tests assert it is empty).
"""

from __future__ import annotations

from typing import Any, cast

import torch


class Lens:
    """TransformerLens surface over a depthlens model_like; every other attribute is the model's own."""

    def __init__(self, model: Any, tokenizer: Any = None):
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)

    @classmethod
    def from_pretrained(
        cls, path: Any, *, device: str = "cpu", dtype: Any = None, tokenizer: str | None = None
    ) -> Lens:
        """A Lens over the model at `path` (depthlens checkpoint, HF directory or GGUF file, through the one loader
        `depthlens.open`), in eval mode, with the tokenizer it ships (`tokenizer`: a spec that overrides it)."""
        from .load import open_model

        op = open_model(path, device=device, dtype=dtype, tokenizer=tokenizer)
        return cls(op.model, op.tokenizer)

    def __getattr__(self, name: str) -> Any:  # only called for names Lens itself does not define
        return getattr(self.__dict__["model"], name)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs)

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """(logits (B, T, V), ActivationCache). Keywords as HookedRootModule.run_with_cache (names_filter...)."""

        out, cache = self.model.run_with_cache(*args, **kwargs)
        return out, _cache_class()(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("no tokenizer: pass Lens(model, tokenizer) or token ids")
        return self.tokenizer

    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None, **_: Any) -> torch.Tensor:
        """(B, T) ids. HF tokenizers follow their own BOS default; depthlens tokenizers prepend `bos_id`."""
        tok = self._tokenizer()
        device = next(self.model.parameters()).device
        if hasattr(tok, "to_tokens"):
            return tok.to_tokens(text, prepend_bos=prepend_bos, device=device)
        texts = [text] if isinstance(text, str) else list(text)
        bos = tok.bos_id is not None if prepend_bos is None else prepend_bos
        rows = [([tok.bos_id] if bos else []) + tok.encode(t) for t in texts]
        T = max(len(r) for r in rows)
        return torch.tensor([r + [0] * (T - len(r)) for r in rows], dtype=torch.long, device=device)

    def to_string(self, tokens: Any) -> str | list[str]:
        """Text of ids: a (T,) tensor or list -> str, a (B, T) tensor or list of lists -> list[str]. Special ids
        (BOS) are dropped, as the tokenizer's `decode` does."""
        tok = self._tokenizer()
        ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        if ids and isinstance(ids[0], list):
            return [tok.decode(row) for row in ids]
        return tok.decode(ids)

    def to_str_tokens(self, input: Any, prepend_bos: bool | None = None, **_: Any) -> list[str] | list[list[str]]:
        """One string per token, as TransformerLens: text is tokenised first (BOS per `prepend_bos`, as
        `to_tokens`); a (T,) tensor or list gives list[str], a (B, T) one list[list[str]]. BOS shows as the
        tokenizer's BOS text (`<bos>` for the byte tokenizer), never as an empty string."""
        if isinstance(input, str):
            input = self.to_tokens(input, prepend_bos=prepend_bos)[0]
        ids = input.tolist() if isinstance(input, torch.Tensor) else list(input)
        if ids and isinstance(ids[0], list):
            return [[self._piece(i) for i in row] for row in ids]
        return [self._piece(int(i)) for i in ids]

    def _piece(self, i: int) -> str:
        tok = self._tokenizer()
        hf = getattr(tok, "tok", None)  # adapters.tokenizer.HFTokenizer: the transformers tokenizer
        if hf is not None:
            return str(hf.decode([i], clean_up_tokenization_spaces=False))
        if i == getattr(tok, "bos_id", None):
            return "<bos>"
        return str(tok.decode([i]))

    def to_single_token(self, string: str) -> int:
        """The id of `string` when it is exactly one token (ValueError otherwise), as TransformerLens."""
        ids = self._tokenizer().encode(string)
        if len(ids) != 1:
            raise ValueError(f"{string!r} is {len(ids)} tokens, not one: {ids}")
        return int(ids[0])

    @property
    def W_E(self) -> torch.Tensor:
        """The token embedding, (d_vocab, d_model)."""
        return self._embedding().weight

    @property
    def W_U(self) -> torch.Tensor:
        """The unembedding, (d_model, d_vocab): logits = final_norm(h_L) @ W_U (+ b_U where the head has one).
        The final norm's gain is not folded in (TransformerLens folds it); `tokens_to_residual_directions` does."""
        return self._unembedding().weight.T

    def _embedding(self) -> Any:
        m = self.model
        emb = getattr(m, "embed_tokens", None)
        if emb is None and hasattr(getattr(m, "hf", None), "get_input_embeddings"):
            emb = m.hf.get_input_embeddings()
        if emb is None:
            raise AttributeError(f"W_E: {type(m).__name__} has no token embedding depthlens knows")
        return emb

    def _unembedding(self) -> Any:
        m = self.model
        head = getattr(m, "lm_head", None)
        if head is None and hasattr(getattr(m, "hf", None), "get_output_embeddings"):
            head = m.hf.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None:
            raise AttributeError(f"W_U: {type(m).__name__} has no linear LM head depthlens knows")
        return head

    def tokens_to_residual_directions(self, tokens: Any) -> torch.Tensor:
        """The residual-stream direction whose dot product with the final-normalised state h_L / scale is the
        token's logit: W_U[:, t] times the final norm's gain (what TransformerLens gets by folding the gain into
        W_U). (d_model,) for one token (an id or a one-token string), (..., d_model) for a tensor of ids. This is
        what `ActivationCache.logit_attrs` calls. Native depthlens models only: a foreign model's final norm
        may not be gain * x / rms (Gemma's 1 + gain, a LayerNorm's centring and bias), which the cache's
        attribution would silently get wrong; it is refused there."""
        from ..models.model import DepthModel

        if not isinstance(self.model, DepthModel) or getattr(self.model, "ln_final", None) is None:
            raise NotImplementedError(
                f"logit_attrs / tokens_to_residual_directions: supported on native depthlens models with a final "
                f"RMSNorm; {type(self.model).__name__} is not one. Use cache.decompose_resid(apply_ln=True) and "
                f"lens.W_U with the model's own final norm instead"
            )
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        ids = torch.as_tensor(tokens, device=self.W_U.device)
        gain = cast(torch.Tensor, self.model.norm.weight)  # the final RMSNorm's gain (d_model,)
        folded = gain[:, None] * self.W_U  # (d_model, d_vocab)
        return folded[:, ids].movedim(0, -1)

    @torch.no_grad()
    def generate(
        self,
        input: Any = "",
        max_new_tokens: int = 10,
        *,
        prepend_bos: bool | None = None,
        do_sample: bool = False,
        return_type: str = "input",
        **kwargs: Any,
    ) -> Any:
        """Greedy decoding (argmax at every step; the whole sequence is re-run each step, no KV cache): text in,
        text out (the prompt and what follows; special tokens dropped), or (B, T) ids in, (B, T + max_new_tokens)
        ids out; `return_type` "str" or "tokens" forces one. Sampling is refused (`do_sample`, temperature...)."""
        if do_sample or any(k in kwargs for k in ("temperature", "top_k", "top_p")):
            raise NotImplementedError(
                "Lens.generate decodes greedily only (do_sample=False, no temperature/top_k/top_p)"
            )
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        text_in = isinstance(input, (str, list)) and (isinstance(input, str) or isinstance(input[0], str))
        toks = self.to_tokens(input, prepend_bos=prepend_bos) if text_in else torch.as_tensor(input)
        toks = toks[None] if toks.ndim == 1 else toks
        ctx = getattr(getattr(self.model, "config", None), "max_seq_len", None)
        for _ in range(max_new_tokens):
            window = toks if ctx is None else toks[:, -ctx:]
            nxt = self.model(window)[:, -1].argmax(-1, keepdim=True)
            toks = torch.cat([toks, nxt.to(toks.device)], dim=1)
        as_text = return_type == "str" or (return_type == "input" and text_in)
        if not as_text:
            return toks
        out = self.to_string(toks)
        return out[0] if isinstance(input, str) and isinstance(out, list) else out


def ln_stack_refusal(model: Any, layer: int | None, mlp_input: bool) -> str | None:
    """Why an LN-scaled stack at `layer` (None/-1/L: the final norm; else ln2 if mlp_input, ln1) would not mean
    "what this residual component contributes to that norm's input" on this model; None where it does."""
    from ..models.model import DepthModel

    if not isinstance(getattr(model, "model", model), DepthModel):  # foreign models: TransformerLens decides
        return None
    design = model.design
    L = model.cfg.n_layers
    slug = design.slug
    if layer is None or layer in (-1, L):
        if getattr(model, "ln_final", None) is None:
            return f"{slug}: this model has no final norm, so there is no LN scale to apply; use apply_ln=False"
        if not design.final_reads_view:
            return (
                f"{slug}: the final norm reads h_L, which is not the residual view hook_resid_post "
                f"({design.view_name}); use apply_ln=False, or cache['hook_resid_final']"
            )
        return None
    if not design.norm_reads_view:
        site = "ln2" if mlp_input else "ln1"
        return (
            f"{slug}: {site} normalises the branch input (hook_{'mlp' if mlp_input else 'attn'}_in), not the "
            f"residual view ({design.view_name}); use apply_ln=False"
        )
    return None


def _cache_class() -> type:
    """`transformer_lens.ActivationCache` whose LN-scaled stacks refuse where they would be wrong
    (`ln_stack_refusal`)."""
    global _CACHE
    if _CACHE is None:
        from transformer_lens import ActivationCache

        class DepthActivationCache(ActivationCache):
            def apply_ln_to_stack(
                self,
                residual_stack: torch.Tensor,
                layer: int | None = None,
                mlp_input: bool = False,
                *args: Any,
                **kwargs: Any,
            ) -> torch.Tensor:
                why = ln_stack_refusal(self.model, layer, mlp_input)
                if why is not None:
                    raise ValueError(why)
                n = self.model.cfg.n_layers
                key = (
                    "ln_final.hook_scale"
                    if layer is None or layer in (-1, n)
                    else f"blocks.{layer}.{'ln2' if mlp_input else 'ln1'}.hook_scale"
                )
                if key not in self.cache_dict:  # a foreign model's norms are its own modules: no scale recorded
                    raise ValueError(
                        f"apply_ln needs the norm scale {key}, which {type(self.model).__name__} does not record "
                        "(its norms are the HF model's own); use apply_ln=False"
                    )
                return super().apply_ln_to_stack(residual_stack, layer, mlp_input, *args, **kwargs)

        _CACHE = DepthActivationCache
    return _CACHE


_CACHE: type | None = None


def run_with_cache(model: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """`Lens(model).run_with_cache(...)`: logits and a `transformer_lens.ActivationCache`."""
    return Lens(model).run_with_cache(*args, **kwargs)


def attached_hooks(model: Any) -> list[str]:
    """Names of hook points that still carry forward or backward hooks (should be empty between calls)."""
    model = getattr(model, "model", model) if isinstance(model, Lens) else model
    return [n for n, hp in model.hook_dict.items() if hp.fwd_hooks or hp.bwd_hooks]


def from_bridge(bridge: Any, tokenizer: Any = None) -> Any:
    """Wrap a TransformerLens `TransformerBridge`'s underlying HF model with the depthlens adapter.

    The bridge replaced the HF submodules with its components in place; they keep the HF call signatures,
    so the adapter runs through them (and the bridge's own hooks still fire). Returns an HFLayeredModel.
    """
    from .hf import HFLayeredModel

    hf = getattr(bridge, "original_model", None)
    if hf is None:
        raise TypeError(f"{type(bridge).__name__} has no original_model; expected a transformer_lens TransformerBridge")
    return HFLayeredModel(hf, tokenizer=tokenizer)

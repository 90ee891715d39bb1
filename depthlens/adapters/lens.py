"""TransformerLens interop: depthlens models as TransformerLens models, and TransformerBridge models as
depthlens models.

Both `DepthModel` and `HFLayeredModel` are `HookedRootModule`s with TransformerLens hook names
(`blocks.{i}.hook_resid_pre|mid|post`, ...) and a `cfg`, so `run_with_hooks` and
`transformer_lens.patching` work on them directly. What TransformerLens' structural `TransformerLensModel`
protocol adds is `to_tokens`, and `run_with_cache` returning an `ActivationCache` (HookedRootModule returns
a plain dict). `Lens` adds exactly those two, as a thin wrapper (the model class is not edited):

    lens = Lens(model, tokenizer)                         # model: DepthModel | HFLayeredModel
    logits, cache = lens.run_with_cache(tokens)           # cache: transformer_lens.ActivationCache
    cache.accumulated_resid()                             # (L+1, B, T, d): h_0 .. h_L (pre final norm)
    patching.get_act_patch_resid_pre(lens, corrupt, cache, metric)   # (L, T)

The other direction: `from_bridge(bridge)` wraps the HF model inside a TransformerLens `TransformerBridge`
with the depthlens adapter, so every depthlens diagnostic runs on a bridge someone already built.

Hooks are global state on a HookedRootModule; everything here goes through `hooks()`/`run_with_*`, which
remove what they add. `attached_hooks(model)` lists leftovers (tests assert it is empty).
"""

from __future__ import annotations

from typing import Any

import torch


class Lens:
    """TransformerLens surface over a depthlens model_like; every other attribute is the model's own."""

    def __init__(self, model: Any, tokenizer: Any = None):
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)

    def __getattr__(self, name: str) -> Any:  # only called for names Lens itself does not define
        return getattr(self.__dict__["model"], name)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs)

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """(logits (B, T, V), ActivationCache). Keywords as HookedRootModule.run_with_cache (names_filter...)."""
        from transformer_lens import ActivationCache

        out, cache = self.model.run_with_cache(*args, **kwargs)
        return out, ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None, **_: Any) -> torch.Tensor:
        """(B, T) ids. HF tokenizers follow their own BOS default; depthlens tokenizers prepend `bos_id`."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError("no tokenizer: pass Lens(model, tokenizer) or token ids")
        device = next(self.model.parameters()).device
        if hasattr(tok, "to_tokens"):
            return tok.to_tokens(text, prepend_bos=prepend_bos, device=device)
        texts = [text] if isinstance(text, str) else list(text)
        bos = tok.bos_id is not None if prepend_bos is None else prepend_bos
        rows = [([tok.bos_id] if bos else []) + tok.encode(t) for t in texts]
        T = max(len(r) for r in rows)
        return torch.tensor([r + [0] * (T - len(r)) for r in rows], dtype=torch.long, device=device)


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

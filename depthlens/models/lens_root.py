"""TransformerLens on demand: a native model is a `HookedRootModule` from the moment one is asked for.

Importing transformer-lens costs seconds (its package `__init__` imports `transformers` and `datasets`), and
most commands never touch a hook. So a `DepthModel` is built with `HookSite`s, identity modules that carry
TransformerLens' hook-point names and the `fwd_hooks`/`bwd_hooks` lists the forward reads (`hooked()`), and
its class is an `nn.Module`. The first use of the TransformerLens surface (`hooks`, `run_with_cache`,
`run_with_hooks`, `hook_dict`, `cfg`, ... every public attribute of `HookedRootModule`, a list a test keeps
complete) imports transformer-lens once and turns the model into one, in place:

* every `HookSite` becomes a `transformer_lens.hook_points.HookPoint` (its class, plus the attributes
  `HookPoint.__init__` sets; torch hooks already registered on it stay);
* the model's class becomes `(type(model), HookedRootModule)` (one class per model class, cached), and
  `HookedRootModule.setup()` names every module and builds `hook_dict`/`mod_dict`, as if it had been one
  from the start.

An unhooked forward is the same computation either way (identity modules). A model built once
transformer-lens is already imported, or built from a class that already is the lens class, is converted
at once, so `type(model)(config)` and `copy.deepcopy(model)` keep their hooks.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

# HookedRootModule's public surface beyond nn.Module (tests/test_startup.py checks it against the installed
# transformer-lens), plus what setup() and our own __init__ would have set.
LENS_ATTRS = frozenset(
    {
        "add_caching_hooks",
        "add_hook",
        "add_perma_hook",
        "cache_all",
        "cache_some",
        "check_and_add_hook",
        "check_hooks_to_add",
        "clear_contexts",
        "context_level",
        "get_caching_hooks",
        "hook_dict",
        "hook_points",
        "hooks",
        "is_caching",
        "list_hooks",
        "mod_dict",
        "remove_all_hook_fns",
        "reset_hooks",
        "run_with_cache",
        "run_with_hooks",
        "setup",
        "cfg",
    }
)


class HookSite(nn.Module):
    """An identity module at a TransformerLens hook-point name, until transformer-lens is asked for (then it
    becomes a `HookPoint`). Its empty `fwd_hooks`/`bwd_hooks` say that nothing is attached."""

    def __init__(self) -> None:
        super().__init__()
        self.fwd_hooks: list[Any] = []
        self.bwd_hooks: list[Any] = []

    def forward(self, x: Any) -> Any:
        return x


def hook_point() -> nn.Module:
    """A hook point for a model under construction: TransformerLens' own when it is already imported, else a
    `HookSite` (turned into one by `make_lens`)."""
    if "transformer_lens.hook_points" in sys.modules:
        hp: nn.Module = sys.modules["transformer_lens.hook_points"].HookPoint()
        return hp
    return HookSite()


_LENS_CLASSES: dict[type, type] = {}


def _lens_class(cls: type) -> type:
    """(cls, HookedRootModule), made once per class."""
    from transformer_lens import HookedRootModule

    if issubclass(cls, HookedRootModule):
        return cls
    if cls not in _LENS_CLASSES:
        ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_is_lens_class": True}
        _LENS_CLASSES[cls] = type(cls.__name__, (cls, HookedRootModule), ns)
    return _LENS_CLASSES[cls]


def make_lens(root: nn.Module) -> None:
    """Turn `root` (a `LensRoot`) and its `HookSite`s into TransformerLens objects, in place (idempotent)."""
    if root.__dict__.get("_lens_on"):
        return
    from transformer_lens.hook_points import HookPoint

    fresh = HookPoint().__dict__  # type: ignore[no-untyped-call]
    for m in root.modules():
        if type(m) is HookSite:
            for k, v in fresh.items():
                if k not in m.__dict__:
                    m.__dict__[k] = v.copy() if isinstance(v, dict | list) else v
            m.__class__ = HookPoint  # type: ignore[assignment]
    root.__dict__.setdefault("is_caching", False)
    root.__dict__.setdefault("context_level", 0)
    root.__class__ = _lens_class(type(root))
    root.__dict__["_lens_on"] = True
    root.cfg = root.lens_config()  # type: ignore[operator]
    root.setup()  # type: ignore[operator]


class LensRoot(nn.Module):
    """Base of a model that becomes a `HookedRootModule` on first use of that surface (module docstring).
    Subclasses define `lens_config()` (the TransformerLens config) and call `lens_ready()` at the end of
    `__init__`."""

    def lens_config(self) -> Any:
        raise NotImplementedError

    def lens_ready(self) -> None:
        """End of __init__: convert now when transformer-lens is loaded or the class already is the lens one."""
        if getattr(type(self), "_is_lens_class", False) or "transformer_lens" in sys.modules:
            make_lens(self)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in LENS_ATTRS and not self.__dict__.get("_lens_on"):
                make_lens(self)
                return getattr(self, name)
            raise

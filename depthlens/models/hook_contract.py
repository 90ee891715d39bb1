"""The contract of a hook point's return value: a hook either leaves the value alone or replaces it by a tensor of
exactly its shape, dtype and device; a read-only view is never edited, in place or otherwise.

Every forward that fires a TransformerLens `HookPoint` goes through `fire` (or `fire_read_only` for a view that
does not write back into the state). Unhooked, `fire` costs one dict lookup and calls the hook point as before, so
an unhooked forward is unchanged; only with a forward hook attached does it compare shape, dtype and device (a
read-only view also keeps one copy to notice an in-place edit).

Why exact: a broadcastable wrong shape ((B, 1, d), (1, T, d) or (d,) for a (B, T, d) residual; (B, T, d) for a
(B, T, 1) norm scale) is accepted by the arithmetic that follows and silently changes the result; a list or a
number fails later with a message that names neither the hook nor the shape. Both raise one `HookError` here.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DepthlensError

__all__ = ["HookError", "check_hook_value", "fire", "fire_read_only"]


class HookError(DepthlensError, RuntimeError):
    """A hook broke the contract of its hook point (wrong shape, dtype, device or type; an edited read-only view)."""


def _name(hook: Any) -> str:
    return getattr(hook, "name", None) or "an unnamed hook point"


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"shape {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')} on {x.device}"
    return f"a {type(x).__name__}"


def check_hook_value(hook: Any, out: Any, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> None:
    """Raise HookError unless `out` is a tensor of exactly `shape`, `dtype` and `device` (what the hook replaced)."""
    if isinstance(out, torch.Tensor) and out.shape == shape and out.dtype == dtype and out.device == device:
        return
    expected = f"shape {tuple(shape)} {str(dtype).removeprefix('torch.')} on {device}"
    raise HookError(
        f"a hook on {_name(hook)} returned {_describe(out)}; it must return a tensor of exactly the {expected} "
        "it replaces (or None to keep it)"
    )


def _version(x: torch.Tensor) -> int | None:
    """The tensor's in-place version counter (None for an inference tensor, which keeps none)."""
    return None if x.is_inference() else x._version


def fire(hook: Any, value: torch.Tensor, *, copy: bool = False) -> Any:
    """`hook(value)`, and with a forward hook attached, the check that what came back can replace `value`.

    `copy`: `value` is also used elsewhere (a branch input is the residual stream itself). Without autograd the
    hook gets a copy, so an in-place edit changes what this hook point feeds, as returning the edited value would
    (TransformerLens' own `hook_mlp_in(resid_mid.clone())`), not the residual behind it as well. With autograd a
    copy would reorder the gradient's sums (a reading hook must leave the backward bit-identical), so the hook
    gets `value` itself and an in-place edit raises HookError (return the edited tensor instead)."""
    if not hook._forward_hooks:  # unhooked (or backward hooks only): the value passes through unchanged
        return hook(value)
    version = None
    if copy and (value.is_inference() or not (torch.is_grad_enabled() and value.requires_grad)):
        value = value.clone()
    elif copy:
        version = value._version
    shape, dtype, device = value.shape, value.dtype, value.device
    out = hook(value)
    check_hook_value(hook, out, shape, dtype, device)
    if version is not None and value._version != version:
        raise HookError(
            f"a hook edited {_name(hook)} in place, which with autograd on would edit the residual stream behind "
            "it too; return the edited tensor instead (x = x.clone(); edit x; return x)"
        )
    return out


def fire_read_only(hook: Any, value: torch.Tensor, what: str, editable: str) -> torch.Tensor:
    """Fire a hook on a view that does not write back into the state (`what` it is); a hook that edits it, in place or
    by returning another value, raises HookError pointing to the hook points that do write back (`editable`).
    Returns `value` itself. An in-place edit is seen by the tensor's version counter (a copy for an inference
    tensor, which has none)."""
    if hook._backward_hooks or hook._backward_pre_hooks:
        raise HookError(
            f"{_name(hook)} is a read-only view ({what}): no gradient flows through it, so a backward hook there "
            f"would never run; hook {editable} instead"
        )
    if not hook._forward_hooks:
        return value  # unhooked: the identity
    version = _version(value)
    before = value.detach().clone() if version is None else value
    out = fire(hook, value)
    if version is not None:
        in_place = value._version != version
    else:
        in_place = not torch.allclose(value.detach(), before, rtol=0, atol=0, equal_nan=True)
    returned = out is not value and not torch.allclose(out.detach(), value.detach(), rtol=0, atol=0, equal_nan=True)
    if in_place or returned:
        how = "in place" if in_place else "by returning another value"
        raise HookError(
            f"{_name(hook)} is a read-only view ({what}) and a hook edited it {how}, which would change nothing; "
            f"edit {editable} instead"
        )
    return value

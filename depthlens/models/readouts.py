"""Readout keys: the one builder of every name in `model.readouts(tokens)` (as TransformerLens's get_act_name).

    readout_key("res_map", sublayer=3)               == "sub3.res_map"          per token, sublayer 3
    readout_key("res_map", sublayer=3, static=True)  == "static.sub3.res_map"   the router's static part
    readout_key("alpha", final=True)                 == "final.alpha"           the final readout's router
    readout_key("h0")                                == "h0"                    model level
    parse_readout_key("static.sub3.res_map")         == ReadoutKey("res_map", sublayer=3, static=True)

Sublayer j = 2ℓ is layer ℓ's attention, j = 2ℓ + 1 its MLP (`sublayer_label(j)` == "attn_ℓ" / "mlp_ℓ", the
labels AttnRes sources and MoDA depth slots carry). Models write with `readout_key`, analysis reads with it,
and nothing splits strings by hand.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_KEY = re.compile(r"^(?P<static>static\.)?(?:sub(?P<sublayer>\d+)\.|(?P<final>final)\.)?(?P<name>[A-Za-z_]\w*)$")


class ReadoutKey(NamedTuple):
    name: str  # what is recorded: "res_map", "alpha", "depth_mass", ...
    sublayer: int | None = None  # j, or None for model-level and final-router readouts
    static: bool = False  # a router's static (input-independent) part, from `Router.readout()`
    final: bool = False  # the final readout's router (AttnRes), not a sublayer's


def readout_key(name: str, sublayer: int | None = None, *, static: bool = False, final: bool = False) -> str:
    """The key of readout `name` of sublayer `sublayer` (or the final router, or the model: sublayer None)."""
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ValueError(f"readout name must be an identifier, got {name!r}")
    if final and sublayer is not None:
        raise ValueError("a readout belongs to a sublayer or to the final router, not both")
    if sublayer is not None and (isinstance(sublayer, bool) or int(sublayer) != sublayer or sublayer < 0):
        raise ValueError(f"sublayer must be an int >= 0, got {sublayer!r}")
    where = f"sub{int(sublayer)}." if sublayer is not None else "final." if final else ""
    return f"{'static.' if static else ''}{where}{name}"


def parse_readout_key(key: str) -> ReadoutKey:
    """The inverse of `readout_key`; ValueError for a key it cannot have built."""
    m = _KEY.match(key)
    if m is None:
        raise ValueError(f"not a readout key: {key!r}")
    j = m["sublayer"]
    return ReadoutKey(m["name"], None if j is None else int(j), bool(m["static"]), bool(m["final"]))


def sublayer_label(j: int) -> str:
    """'attn_ℓ' for j = 2ℓ, 'mlp_ℓ' for j = 2ℓ + 1."""
    return f"{'attn' if j % 2 == 0 else 'mlp'}_{j // 2}"

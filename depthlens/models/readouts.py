"""Readout keys: the one builder of every name in `model.readouts(tokens)` (as TransformerLens's get_act_name).

    readout_key("res_map", sublayer=3)               == "sub3.res_map"          per token, sublayer 3
    readout_key("res_map", sublayer=3, static=True)  == "static.sub3.res_map"   the router's static part
    readout_key("alpha", final=True)                 == "final.alpha"           the final readout's router
    readout_key("h0")                                == "h0"                    model level
    parse_readout_key("static.sub3.res_map")         == ReadoutKey("res_map", sublayer=3, static=True)

`model.readouts(tokens)` returns a `Readouts`: the recorded objects by key, with named accessors, so an engine
asks for what it means (`rec.sublayer("res_map", 3)`, `rec.per_sublayer("alpha", 2 * L)`) and never for a string:

    rec = model.readouts(tokens)
    rec.sublayer("branch_share", j)      # == rec[readout_key("branch_share", sublayer=j)]; KeyError if absent
    rec.per_sublayer("res_map", n_sub)   # [sub0 value or None, sub1 ..., ...]
    rec.static("res_map", j), rec.final("alpha"), rec.model("h0")

Sublayer j = 2ℓ is layer ℓ's attention, j = 2ℓ + 1 its MLP (`sublayer_label(j)` == "attn_ℓ" / "mlp_ℓ", the
labels AttnRes sources and MoDA depth slots carry). Models write with `readout_key`, analysis reads with it,
and nothing splits strings by hand.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

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


class Readouts(dict[str, Any]):
    """What one recording forward wrote, keyed by `readout_key` (a dict, so `rec[key]` and `key in rec` work),
    with named accessors that build the keys. Values are tensors (per token: (B, T, ...)) or Python scalars."""

    def sublayer(self, name: str, j: int, *, static: bool = False) -> Any:
        """Readout `name` of sublayer j (its static part with static=True); KeyError naming the key if absent."""
        return self[readout_key(name, j, static=static)]

    def static(self, name: str, j: int | None = None, *, final: bool = False) -> Any:
        """The static (input-independent) readout `name` of sublayer j, or of the final router with final=True."""
        return self[readout_key(name, j, static=True, final=final)]

    def final(self, name: str) -> Any:
        """Readout `name` of the final readout's router (AttnRes)."""
        return self[readout_key(name, final=True)]

    def model(self, name: str) -> Any:
        """A model-level readout ("h0")."""
        return self[readout_key(name)]

    def has(self, name: str, j: int | None = None, *, static: bool = False, final: bool = False) -> bool:
        return readout_key(name, j, static=static, final=final) in self

    def per_sublayer(self, name: str, n_sub: int, *, static: bool = False) -> list[Any]:
        """[readout `name` of sublayer j for j in 0..n_sub-1], None where a sublayer did not record it."""
        return [self.get(readout_key(name, j, static=static)) for j in range(n_sub)]

    def sublayers_with(self, name: str, *, static: bool = False) -> list[int]:
        """The sublayers j that recorded `name`, ascending."""
        out = []
        for k in self:
            r = parse_readout_key(k)
            if r.name == name and r.sublayer is not None and r.static == static and not r.final:
                out.append(r.sublayer)
        return sorted(out)


def as_readouts(record: Any) -> Readouts:
    """`record` as a `Readouts` (a model's `readouts()` already is one; a plain dict of keys is wrapped)."""
    return record if isinstance(record, Readouts) else Readouts(record)

"""The ten residual designs: one slug each, used everywhere (configs, CLI, checkpoint names, coords).

Kept free of heavy imports so the CLI can list designs instantly.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a design can do that a diagnostic may need (depthlens.diagnostics.registry: `Diagnostic.requires`).
CAPABILITIES = {
    "multistream": "the state carries n streams [B, T, n, d] mixed by residual maps (readout res_map)",
    "depth_softmax": "each sublayer reads a softmax over earlier outputs (readouts alpha, self_weight)",
    "stochastic_maps": "residual maps are projected to be doubly stochastic (Sinkhorn), whatever the parameters",
}


@dataclass(frozen=True)
class Design:
    slug: str  # used in configs, CLI, checkpoint names `<slug>_l<L>`, dataset coords
    name: str  # human-readable name as in the DepthBench collections
    group: str  # [inferred] grouping: baseline | norm | multi_stream | cross_layer
    capabilities: frozenset[str] = frozenset()  # keys of CAPABILITIES: which diagnostics apply

    @property
    def multi_stream(self) -> bool:  # state carries n streams [B, T, n, d]
        return "multistream" in self.capabilities


DESIGNS: dict[str, Design] = {
    d.slug: d
    for d in [
        Design("preln", "Pre-LN", "baseline"),
        Design("lns", "LNS", "norm"),
        Design("sandwich", "Sandwich-LN", "norm"),
        Design("deepnorm", "DeepNorm", "norm"),
        Design("keel", "KEEL", "norm"),
        Design("hc", "HC", "multi_stream", frozenset({"multistream"})),
        Design("mhc", "mHC", "multi_stream", frozenset({"multistream", "stochastic_maps"})),
        Design("full_attnres", "Full AttnRes", "cross_layer", frozenset({"depth_softmax"})),
        Design("block_attnres", "Block AttnRes", "cross_layer", frozenset({"depth_softmax"})),
        Design("moda", "MoDA", "cross_layer"),
    ]
}
SLUGS: tuple[str, ...] = tuple(DESIGNS)


def check_design(slug: str) -> str:
    """Return `slug` if it names a design, else raise ValueError listing the valid ones."""
    if slug not in DESIGNS:
        raise ValueError(f"unknown design {slug!r}; expected one of: {', '.join(SLUGS)}")
    return slug


def has_capability(slug: str, flag: str) -> bool:
    """Whether design `slug` has capability `flag` (a key of CAPABILITIES; unknown designs have none)."""
    if flag not in CAPABILITIES:
        raise ValueError(f"unknown design capability {flag!r}; expected one of: {', '.join(CAPABILITIES)}")
    return slug in DESIGNS and flag in DESIGNS[slug].capabilities


def checkpoint_name(slug: str, n_layer: int) -> str:
    """Canonical checkpoint directory name, e.g. `hc_l16`."""
    return f"{check_design(slug)}_l{n_layer}"

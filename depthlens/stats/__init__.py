"""Pure numerics on arrays: diagnostic math, late-window shares and the bootstrap, ordinal claims."""

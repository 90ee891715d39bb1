"""What the AttnRes readout headlines: the ε of the dead prefix k*(ε) in the report's column and in `track`."""

DEAD_PREFIX_EPS = 0.05  # the ε of the report's dead-prefix column and of `track`

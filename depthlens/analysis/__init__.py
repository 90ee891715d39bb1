"""Layer-level depth diagnostics: pure metrics, statistics, labelled datasets and plots.

Submodules: `metrics` (torch math), `stats` (numpy shares/sweeps/bootstrap), `dataset` (xarray/netCDF),
`plots` (matplotlib/seaborn/rich). The public API is re-exported here by the lead.
"""

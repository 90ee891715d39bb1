"""Deprecated: the package that held the diagnostics and the Python API before they moved to
`depthlens.diagnostics`, `depthlens.stats`, `depthlens.runtime`, `depthlens.render` and `depthlens.studies`.
Only `depthlens.analysis.api` is kept (one version, with a DeprecationWarning); use `import depthlens as dl`."""

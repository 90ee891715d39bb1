"""Cross-checkpoint reports: compute every diagnostic on a set of checkpoints, then write figures, tables,
merged netCDF datasets and an HTML + Markdown page into one directory, atomically.

    from depthlens.report import ReportOptions, build_report
    report = build_report(["checkpoints/preln_l8", "checkpoints/hc_l8"], "reports/mine", ReportOptions())

Modules: `build` (load, compute, summarise, write), `figures` (per-checkpoint and cross-checkpoint PNGs),
`render` (index.html and README.md). The CLI entry point is `depthlens report` (depthlens/cli/report.py).
"""

from __future__ import annotations

from .build import METRICS, Report, ReportOptions, build_report

__all__ = ["METRICS", "Report", "ReportOptions", "build_report"]

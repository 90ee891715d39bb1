"""Figures, plots, terminal views and the HTML/Markdown pages of a report."""

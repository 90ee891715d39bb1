"""Workflows over many models: the Python API, report building, track, definition sensitivity."""

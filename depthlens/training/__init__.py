"""Minimal trainer pieces: shape planning (`shapes`), and the training loop built on top of it."""

"""Shared test set-up: one torch thread (a busy second core slows 2-thread runs 9x), offline hubs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# no progress lines on stderr: a busy machine would interleave them with the one-line errors tests count;
# tests/test_progress.py and tests/test_feedback.py turn progress back on
os.environ.setdefault("DEPTHLENS_PROGRESS", "off")

import torch  # noqa: E402

torch.set_num_threads(1)

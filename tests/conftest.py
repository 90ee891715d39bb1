"""Shared test set-up: one torch thread (a busy second core slows 2-thread runs 9x), offline hubs, and the
shared fixtures."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# no progress lines on stderr: a busy machine would interleave them with the one-line errors tests count;
# tests/test_progress.py and tests/test_feedback.py turn progress back on
os.environ.setdefault("DEPTHLENS_PROGRESS", "off")

import pytest  # noqa: E402
import torch  # noqa: E402

# At import, so that models built while modules are collected run on one thread too; the fixture below puts
# it back if a test changes it. Test modules do not set it themselves (subprocess workers still do).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_gguf_cache(tmp_path_factory, monkeypatch):
    """Each test its own GGUF cache (adapters.gguf_cache): no test reads an entry another test (or a user) stored,
    so results do not depend on test order, and nothing is written under ~/.cache. Subprocesses inherit it."""
    monkeypatch.setenv("DEPTHLENS_GGUF_CACHE", str(tmp_path_factory.mktemp("gguf-cache")))


@pytest.fixture(scope="module")
def data(request):
    """Random eval tokens over a 97-token vocabulary with BOS 96, one set per test module. The module sizes
    it with `EVAL = (n_seq, seq_len, seed)` (default (3, 16, 0))."""
    from depthlens.runtime.evaldata import random_eval_data

    n_seq, seq_len, seed = getattr(request.module, "EVAL", (3, 16, 0))
    return random_eval_data(97, n_seq=n_seq, seq_len=seq_len, seed=seed, bos_id=96)


# --- order: the long tests first, on both workers ----------------------------------------------------------
# pytest-xdist's worksteal scheduler hands its first worker the first half of the collected tests and the second
# worker the rest, then moves queued tests between them; a long test that starts last leaves the other core idle
# to the end. So the long tests (tests/durations.json, measured) go first, each into the half with less work.
_DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import json

    with open(_DURATIONS) as f:
        seconds: dict[str, float] = json.load(f)["seconds"]
    long = sorted((i for i in items if i.nodeid in seconds), key=lambda i: -seconds[i.nodeid])
    short = [i for i in items if i.nodeid not in seconds]
    halves: tuple[list[pytest.Item], list[pytest.Item]] = ([], [])
    load = [0.0, 0.0]
    for item in long:  # longest first into the lighter half (LPT)
        k = int(load[1] < load[0])
        halves[k].append(item)
        load[k] += seconds[item.nodeid]
    n_first = len(items) // 2  # what worksteal sends the first of two workers
    fill = max(0, n_first - len(halves[0]))
    items[:] = halves[0] + short[:fill] + halves[1] + short[fill:]

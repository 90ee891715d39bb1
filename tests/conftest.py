"""Shared test set-up: one torch thread (a busy second core slows 2-thread runs 9x), offline hubs, and the
shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# no progress lines on stderr: a busy machine would interleave them with the one-line errors tests count;
# tests/test_progress.py and tests/test_feedback.py turn progress back on
os.environ.setdefault("DEPTHLENS_PROGRESS", "off")

import pytest  # noqa: E402
import typer  # noqa: E402


@pytest.hookimpl(trylast=True)  # after pytest-xdist's, which registers its controller's "dsession"
def pytest_configure(config: pytest.Config) -> None:
    """Where tests are collected and run (not in pytest-xdist's controller, which only hands them out: importing
    torch there is two seconds of nothing): one torch thread before collection, so that models built while
    modules are collected run on one thread too (the fixture below puts it back if a test changes it; test
    modules do not set it themselves, subprocess workers still do), and the CLI's command tree built once."""
    if config.pluginmanager.has_plugin("dsession"):
        return
    # the quick loop (`-m "not slow"`): tests that scale their own work (the fuzzers' example counts) read this;
    # the whole suite runs them in full
    os.environ["DEPTHLENS_TEST_LOOP"] = "quick" if config.getoption("markexpr", "") == "not slow" else "full"
    import torch

    torch.set_num_threads(1)
    _build_cli_once()


def _build_cli_once() -> None:
    """typer's CliRunner rebuilds the whole click command tree from the command functions on every `invoke`
    (about 30 ms; the quick loop invokes some 550 times). The installed `depthlens` builds it once per process, so
    here too: once per app and set of registered commands (a command added later gives a new tree). Click
    commands keep no state between calls: each call parses into a fresh Context."""
    import typer.testing

    build = typer.testing._get_command
    built: dict[int, tuple[typer.Typer, tuple[int, ...], object]] = {}

    def get_command(app: typer.Typer) -> object:
        infos = [app.registered_callback, app.info.callback, *app.registered_commands, *app.registered_groups]
        key = tuple(map(id, infos))
        hit = built.get(id(app))
        if hit is None or hit[0] is not app or hit[1] != key:
            hit = built[id(app)] = (app, key, build(app))
        return hit[2]

    typer.testing._get_command = get_command  # the name typer.testing.CliRunner.invoke calls


@pytest.fixture(autouse=True)
def _one_torch_thread():
    yield
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_gguf_cache(tmp_path_factory, monkeypatch):
    """Each test its own GGUF cache (adapters.gguf_cache): no test reads an entry another test (or a user) stored,
    so results do not depend on test order, and nothing is written under ~/.cache. Subprocesses inherit it."""
    monkeypatch.setenv("DEPTHLENS_GGUF_CACHE", str(tmp_path_factory.mktemp("gguf-cache")))


@pytest.fixture(autouse=True)
def _no_result_cache(monkeypatch):
    """No result cache (studies.cache) unless a test asks for one (`result_cache`): every other test computes what
    it checks, so no comparison of two runs (threads, ranks, batch sizes, a rerun) is answered from a stored
    result, and nothing is written under ~/.cache. Subprocesses inherit it."""
    monkeypatch.setenv("DEPTHLENS_RESULTS_CACHE", "off")


@pytest.fixture
def result_cache(tmp_path_factory, monkeypatch) -> Path:
    """A result cache of this test's own (empty), on for it and its subprocesses."""
    folder = tmp_path_factory.mktemp("result-cache")
    monkeypatch.setenv("DEPTHLENS_RESULTS_CACHE", str(folder))
    monkeypatch.delenv("DEPTHLENS_NO_CACHE", raising=False)
    return folder


def _listing(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Callable[..., Path]:
    """The tiny checkpoints the CLI tests run on, each built and saved once per session (per xdist worker) and
    shared: `tiny_ckpt("hc")` is the folder of `ModelConfig.debug("hc", vocab_size=257, max_seq_len=32)` at seed
    0, named `hc_l4` (the name a report shows); keyword arguments set other config fields. Read it, never write
    into it (copy it first): each call checks that no earlier test changed its files."""
    import depthlens
    from depthlens.models import ModelConfig, build_model

    root = tmp_path_factory.mktemp("tiny-ckpts")
    made: dict[tuple, tuple[Path, list[tuple[str, int, int]]]] = {}

    def get(arch: str = "preln", seed: int = 0, **fields: Any) -> Path:
        key = (arch, seed, *sorted(fields.items()))
        if key not in made:
            cfg = ModelConfig.debug(arch, **{"vocab_size": 257, "max_seq_len": 32, **fields})
            path = depthlens.save(build_model(cfg, seed=seed), root / str(len(made)) / f"{arch}_l{cfg.n_layer}")
            made[key] = (path, _listing(path))
        path, listing = made[key]
        assert _listing(path) == listing, f"a test changed the shared checkpoint {path}: copy it before editing"
        return path

    return get


@pytest.fixture(scope="module")
def data(request):
    """Random eval tokens over a 97-token vocabulary with BOS 96, one set per test module. The module sizes
    it with `EVAL = (n_seq, seq_len, seed)` (default (3, 16, 0))."""
    from depthlens.runtime.evaldata import random_eval_data

    n_seq, seq_len, seed = getattr(request.module, "EVAL", (3, 16, 0))
    return random_eval_data(97, n_seq=n_seq, seq_len=seq_len, seed=seed, bos_id=96)


@pytest.fixture(scope="module")
def text(request, tmp_path_factory) -> Path:
    """An eval text file, one per test module: the module's `TEXT` (a string) written to eval.txt."""
    p = tmp_path_factory.mktemp("data") / "eval.txt"
    p.write_text(request.module.TEXT)
    return p


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

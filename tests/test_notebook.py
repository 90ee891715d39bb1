"""docs/explore.ipynb executes top to bottom (nbclient) in a kernel running this interpreter, offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[1] / "docs" / "explore.ipynb"
KERNEL = "depthlens-test-python"


@pytest.fixture()
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec pointing at sys.executable (the venv), found first via JUPYTER_PATH; runtime files in tmp.

    The venv's own `python3` spec launches plain `python` from PATH, which need not be the venv's. Skips, with the
    reason, where the dev extra's notebook tools are not installed (a runtime-only `pip install .`).
    """
    for mod in ("nbclient", "nbformat", "ipykernel"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (pip install -e '.[dev]' brings it)")
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "depthlens test kernel",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")


@pytest.mark.slow
@pytest.mark.parametrize("tiny", [False, True], ids=["zoo-checkpoint", "tiny-model"])
def test_explore_notebook_executes(kernel_env, monkeypatch, tiny):
    import warnings

    has_zoo = any((NOTEBOOK.parents[1] / "checkpoints").glob("*_l8/config.json"))
    if not tiny and not has_zoo:
        pytest.skip("no shipped *_l8 checkpoint: the notebook falls back to the tiny model (the other case)")
    if tiny:
        monkeypatch.setenv("DEPTHLENS_NOTEBOOK_TINY", "1")

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert len(nb.cells) > 5
    with warnings.catch_warnings():
        # jupyter_client/zmq emit event-loop and deprecation noise on some platforms; not ours to fix
        warnings.simplefilter("ignore")
        NotebookClient(
            nb,
            kernel_name=KERNEL,
            timeout=1200,
            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
            allow_errors=False,
        ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # a newcomer's first run shows no warnings (the TqdmWarning of a kernel without ipywidgets, deprecations...)
    stderr = "".join(
        o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"
    )
    assert "Warning" not in stderr and "warn" not in stderr.lower(), stderr
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 4  # heatmaps and share curves drawn


def _run_cells(sources: list[str]) -> tuple[list[list[dict]], dict]:
    """Execute `sources` as the code cells of a fresh notebook in the test kernel: the outputs of each cell, and
    the final state of every widget model (by model id)."""
    import warnings

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jupyter_client/zmq event-loop noise, as above
        NotebookClient(nb, kernel_name=KERNEL, timeout=600, allow_errors=False, store_widget_state=True).execute()
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return [c.get("outputs", []) for c in nb.cells], state


TINY = """
import torch
import depthlens as dl
from depthlens.models import ModelConfig, build_model
model = build_model(ModelConfig.debug("preln", n_layer=4), seed=0)
tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
"""


def _widgets(outputs: list[dict]) -> list[dict]:
    return [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]


@pytest.mark.slow
def test_the_api_shows_a_notebook_progress_bar_and_none_when_asked(kernel_env):
    """`dl.causal(...)` in a notebook draws an ipywidgets progress bar (tqdm.auto's notebook bar), which ends at
    the engine's total; `progress=False` draws nothing; no warning either way."""
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed (the notebook extra): no widget to draw")
    (setup, shown, hidden), state = _run_cells(
        [
            TINY,
            "ds = dl.causal(model, tokens)\nprint(ds['causal_score'].sizes['variant'])",
            "ds = dl.causal(model, tokens, progress=False)",
        ]
    )
    bars = _widgets(shown)
    assert len(bars) == 1, shown  # one bar for the one engine run
    text = "".join(o.get("text", "") for o in shown if o.get("output_type") == "stream")
    assert text.split() == ["1"], text  # one variant by default, as the CLI (no stderr, so no warning)
    assert "causal preln" in bars[0]["data"].get("text/plain", ""), bars  # labelled by diagnostic and model
    progress = [m["state"] for m in state.values() if m.get("model_name") in ("FloatProgressModel", "IntProgressModel")]
    assert [(p["value"], p["max"]) for p in progress] == [(4, 4)], progress  # ended at the engine's total: 4 skips
    assert hidden == [] and setup == []

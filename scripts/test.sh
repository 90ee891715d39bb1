#!/usr/bin/env bash
# Set up (if needed), then the checks CI runs, in order: lint, format, types, the test suite on the CPU.
# Arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check depthlens tests bench scripts
.venv/bin/ruff format --check depthlens tests bench scripts
.venv/bin/mypy  # the package, configured in pyproject.toml ([tool.mypy])
exec .venv/bin/python -m pytest "$@"

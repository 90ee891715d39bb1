#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Set up (if needed) and run the main job: analyse every shipped checkpoint into reports/zoo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/depthlens report checkpoints/*/ --out reports/zoo "$@"

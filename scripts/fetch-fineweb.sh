#!/usr/bin/env bash
# Download the pre-tokenized FineWeb-Edu 10B GPT-2 shards (modded-nanogpt format; ~20 GB, needs network) for the
# paper-scale recipes (docs/training.md), then check that both splits open.
#
#   bash scripts/fetch-fineweb.sh [DIR] [N_TRAIN]   # default data/finewebedu10B, 99 train shards (100M tokens each)
#
# The only script of the project that downloads; nothing else (tests, the main job) reaches the network.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-data/finewebedu10B}
N=${2:-99}
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip install -q huggingface_hub
"$PY" - "$DIR" "$N" <<'EOF'
import sys
from huggingface_hub import hf_hub_download

out, n = sys.argv[1], int(sys.argv[2])
get = lambda f: hf_hub_download("kjj0/finewebedu10B-gpt2", f, repo_type="dataset", local_dir=out)
get("finewebedu_val_000000.bin")
for i in range(1, n + 1):
    print(f"train shard {i}/{n}", file=sys.stderr, flush=True)
    get(f"finewebedu_train_{i:06d}.bin")
EOF
"$PY" -c "import sys; from depthlens.data.shards import TokenDataset as T; d = sys.argv[1]; print(T.from_dir(d), T.from_dir(d, 'val'))" "$DIR"

#!/usr/bin/env bash
# Train the shipped CPU zoo from the committed recipe, one model at a time on one core.
#
#   scripts/train_zoo.sh                 # every run of depthlens/recipes/zoo_cpu.json not yet in checkpoints/
#   scripts/train_zoo.sh hc_l16 mhc_l8   # only these runs
#   scripts/train_zoo.sh --force ...     # retrain even if checkpoints/<name>/ exists (from scratch)
#
# A killed run resumes from .cache/depthlens/runs/zoo/<name>/resume when the script is rerun.
# Env: RECIPE (default depthlens/recipes/zoo_cpu.json), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${RECIPE:-depthlens/recipes/zoo_cpu.json}
PY=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

force=0
runs=()
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) runs+=("$a") ;;
  esac
done
[ ${#runs[@]} -gt 0 ] || mapfile -t runs < <("$PY" -m depthlens.training.trainer "$RECIPE" --list)

# the corpus the recipe names (its "corpus" block), built once; deterministic, so the data hash repeats
"$PY" -c "import json,sys; from depthlens.training.recipes import prepare_zoo_data; \
print('data:', prepare_zoo_data(json.load(open(sys.argv[1]))))" "$RECIPE"

for name in "${runs[@]}"; do
  if [ $force -eq 0 ] && [ -f "checkpoints/$name/train.json" ]; then
    echo "skip $name (checkpoints/$name exists; --force retrains)"
    continue
  fi
  extra=()
  [ $force -eq 1 ] && extra+=(resume=false)
  echo "== $name ($(date +%H:%M:%S))"
  "$PY" -m depthlens.training.trainer "$RECIPE" --run "$name" "${extra[@]}"
done

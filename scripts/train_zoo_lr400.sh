#!/usr/bin/env bash
# The LR check at the zoo's budget (depthlens/training/lr400.py): one run at a time, in the plan's order
# (a: seed 0 at the current LR's neighbours, b: a second seed at the winner, c: paired seeds at the
# neighbours, a third everywhere), the results file rewritten after every run.
#
#   scripts/train_zoo_lr400.sh            # continue the plan until it is done (a killed run resumes)
#   MAX_RUNS=3 scripts/train_zoo_lr400.sh # at most 3 runs this time
#
# Runs write under .cache/depthlens/runs/zoo_lr400/ (never checkpoints/); results in
# depthlens/recipes/zoo_cpu_lr400_results.json. One thread; run it under `nice -n 19` beside other work.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RECIPE=depthlens/recipes/zoo_cpu_lr400.json
MAX_RUNS=${MAX_RUNS:-1000}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

"$PY" -c "import json,sys; from depthlens.training.recipes import prepare_zoo_data; \
print('data:', prepare_zoo_data(json.load(open(sys.argv[1]))))" "$RECIPE"
n=0 last=
while [ "$n" -lt "$MAX_RUNS" ]; do
  name=$("$PY" -m depthlens.training.lr400 next)
  [ -n "$name" ] || { echo "lr400: plan done"; break; }
  [ "$name" != "$last" ] || { echo "lr400: $name did not finish; stopping" >&2; exit 1; }
  echo "== $name ($(date -u +%H:%M:%S))"
  "$PY" -m depthlens.training.trainer "$RECIPE" --run "$name" || echo "FAILED $name" >&2
  "$PY" -m depthlens.training.lr400 collect
  last=$name n=$((n + 1))
done

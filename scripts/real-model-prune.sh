#!/usr/bin/env bash
# `depthlens prune` on the atlas models by path, and on a depthlens checkpoint, each pruned model reloaded by its own
# loader and its held-out loss recomputed outside depthlens -> reports/atlas/prune.json.
#
#   bash scripts/real-model-prune.sh                                      # the three GGUF files + checkpoints/preln_l16
#   MODELS=gemma-3-270m CHECKPOINTS= bash scripts/real-model-prune.sh     # one model, no checkpoint
#
# Per model: `depthlens prune FILE --tolerance TOL --k-max K --n-seq N_SEQ --seq-len SEQ_LEN --json` (the default eval
# data: the offline corpus through the model's own tokenizer; the default criterion, greedy, which costs about k x L
# calibration forwards), its exit status, wall and CPU seconds (/usr/bin/time). TOL and K are per model (`tol_of`,
# `kmax_of`; TOLERANCE / K_MAX override them for all): at 0.25 nothing of Gemma 3 can go (its first layer's held-out
# bounds are 0.33-0.39 nats), and Qwen's greedy scan is capped at k = 3 to keep it near 13 CPU-minutes (a depthlens
# checkpoint: every layer but the ends may go). Then, in a separate Python process that does not import depthlens'
# model code, the written Hugging Face directory is loaded with plain `transformers.AutoModelForCausalLM
# .from_pretrained`, the certificate's eval windows are read again through depthlens' eval-data loader (their SHA-256
# checked against the certificate) and each domain's held-out loss is recomputed on the certificate's positions
# (0..T-2) and sequences;
# the unpruned model's clean loss is recomputed the same way from the GGUF file with plain transformers. A depthlens
# checkpoint is reloaded with `depthlens.load` and its loss recomputed by the same few lines. A record per model
# replaces that model's earlier one; the file is written atomically.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
PY=.venv/bin/python
N_SEQ=${N_SEQ:-16} SEQ_LEN=${SEQ_LEN:-128}
tol_of() { case $1 in gemma-3-270m) echo 0.5 ;; qwen2.5-coder-0.5b-instruct) echo 0.1 ;; *) echo 0.25 ;; esac; }
kmax_of() {
  case $1 in
    qwen2.5-coder-0.5b-instruct) echo 3 ;;
    smollm2-135m-instruct | gemma-3-270m) echo 6 ;;
    *) echo 1000 ;; # all the layers the default protect policy allows
  esac
}
MODELS=${MODELS-smollm2-135m-instruct gemma-3-270m qwen2.5-coder-0.5b-instruct}
CHECKPOINTS=${CHECKPOINTS-checkpoints/preln_l16}
export OMP_NUM_THREADS=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DEPTHLENS_PROGRESS=off
paths=""
# shellcheck disable=SC2086  # MODELS is a list
[ -z "$MODELS" ] || paths=$(bash scripts/fetch-real-models.sh $MODELS)
for ck in $CHECKPOINTS; do
  paths+="${paths:+$'\n'}$(basename "$ck")"$'\t'"$ck"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while IFS=$'\t' read -r name path; do
  [ -n "$name" ] || continue
  tol=${TOLERANCE:-$(tol_of "$name")} kmax=${K_MAX:-$(kmax_of "$name")}
  args=(prune "$path" --tolerance "$tol" --k-max "$kmax" --n-seq "$N_SEQ" --seq-len "$SEQ_LEN" --threads 1
    --out "$work/$name.pruned" --json)
  rc=0
  nice -n 5 /usr/bin/time -f '%e %U %S' -o "$work/$name.time" .venv/bin/depthlens "${args[@]}" \
    > "$work/$name.out" 2> "$work/$name.err" || rc=$?
  echo "real-model-prune: $name prune -> exit $rc ($(cat "$work/$name.time" | tail -1) s wall user sys)" >&2
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$path" "$rc" "$tol" "$kmax" "depthlens ${args[*]/#$work\//\$TMP/}" \
    >> "$work/runs.tsv"
  if [ "$rc" = 0 ]; then
    crc=0
    nice -n 5 "$PY" - "$work/$name.pruned" "$path" > "$work/$name.check.json" 2> "$work/$name.check.err" <<'EOF' || crc=$?
# the check: plain transformers (or depthlens.load for a depthlens checkpoint) and a few lines of loss
import json, sys, time
from pathlib import Path

import torch
import torch.nn.functional as F

t0 = time.time()
out, src = Path(sys.argv[1]), Path(sys.argv[2])
cert = json.loads((out / "prune_certificate.json").read_text())
ev = cert["eval_data"]
torch.set_num_threads(1)


def seq_nll(logits, toks):
    """(N,) mean next-token NLL over positions 0..T-2 of each sequence (float64)."""
    lg = logits[:, :-1].double()
    nll = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), toks[:, 1:].reshape(-1), reduction="none")
    return nll.reshape(toks.shape[0], -1).mean(1)


def per_seq(forward, toks):
    with torch.no_grad():
        return torch.cat([seq_nll(forward(toks[i : i + 4]), toks[i : i + 4]) for i in range(0, len(toks), 4)])


from depthlens.runtime.evaldata import load_eval_data  # the eval windows only; no model code

if src.is_file():  # a GGUF file: its tokenizer read by transformers, named as depthlens names it (the corpus cache key)
    import hashlib

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from depthlens.adapters.tokenizer import HFTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name, local_files_only=True)
    vocab = hashlib.sha256(json.dumps(sorted(hf_tok.get_vocab().items())).encode()).hexdigest()[:12]
    tok = HFTokenizer(hf_tok, name=f"gguf-{src.stem}-{vocab}")
    pruned = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    clean_model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32).eval()
    loader = "transformers.AutoModelForCausalLM.from_pretrained(pruned dir); clean: the GGUF file, dtype float32"
    n_layer = pruned.config.num_hidden_layers
    dtype = str(pruned.dtype).replace("torch.", "")
    attn = pruned.config._attn_implementation
    fwd_pruned, fwd_clean = (lambda x: pruned(x).logits), (lambda x: clean_model(x).logits)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}
else:  # a depthlens checkpoint: depthlens' own loader, the loss by the lines above
    import depthlens

    tok = json.loads((src / "tokenizer_config.json").read_text())["kind"]
    pruned, clean_model = depthlens.load(out).model.eval(), depthlens.load(src).model.eval()
    loader = "depthlens.load (pruned and input checkpoints)"
    n_layer, dtype, attn = pruned.config.n_layer, str(next(pruned.parameters()).dtype).replace("torch.", ""), None
    fwd_pruned, fwd_clean = pruned, clean_model
    versions = {"torch": torch.__version__.split("+")[0]}
data = load_eval_data(None, tok, n_seq=ev["n_seq"], seq_len=ev["seq_len"], seed=ev["eval_seed"])
assert data.sha256 == ev["sha256"], f"eval data {data.sha256} is not the certificate's {ev['sha256']}"
held = ev["heldout_sequences"]
toks = data.tokens[held].long()
loss, clean = per_seq(fwd_pruned, toks), per_seq(fwd_clean, toks)
dom = [ev["domains"][i] for i in held]
scopes = {}
for s, r in cert["result"].items():
    ix = [i for i, d in enumerate(dom) if s == "pooled" or d == s]
    lp, lc = float(loss[ix].mean()), float(clean[ix].mean())
    scopes[s] = {
        "n_sequences": len(ix),
        "recomputed_pruned_loss": lp,
        "pruned_loss_difference": lp - r["pruned_loss"],
        "recomputed_clean_loss": lc,
        "clean_loss_difference": lc - r["clean_loss"],
        "recomputed_delta": lp - lc,
    }
mods = sorted(m for m in sys.modules if m.startswith("depthlens."))
print(json.dumps({
    "loader": loader,
    "n_layer_loaded": n_layer,
    "dtype": dtype,
    "attn_implementation": attn,
    "eval_sha256_matches": True,
    "versions": versions,
    "depthlens_modules_imported": mods,
    "wall_s": round(time.time() - t0, 1),
    "scopes": scopes,
}))
EOF
    echo "real-model-prune: $name check -> exit $crc" >&2
    [ "$crc" = 0 ] || tail -3 "$work/$name.check.err" >&2
  fi
done <<< "$paths"
"$PY" - "$work" "$N_SEQ" "$SEQ_LEN" <<'EOF'
import json, os, sys, tempfile
from pathlib import Path

work, n_seq, seq_len = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
runs = []
for line in (work / "runs.tsv").read_text().splitlines():
    name, path, rc, tol, k_max, cmd = line.split("\t")
    wall, user, sys_ = (float(x) for x in (work / f"{name}.time").read_text().split()[-3:])
    err = (work / f"{name}.err").read_text().strip().splitlines()
    rec = {"model": name, "path": path, "command": cmd, "exit": int(rc), "wall_s": wall, "cpu_s": round(user + sys_, 1),
           "eval": f"{n_seq} x {seq_len}", "tolerance": float(tol), "k_max": int(k_max),
           "stderr_last": err[-1] if int(rc) and err else None}
    if int(rc) == 0:
        cert = json.loads((work / f"{name}.out").read_text())
        try:
            check = json.loads((work / f"{name}.check.json").read_text())
        except ValueError:  # the check itself failed: recorded, and the run counts as failed
            err = (work / f"{name}.check.err").read_text().strip().splitlines()
            check = {"error": err[-1] if err else "no output", "scopes": {s: {} for s in cert["result"]}}
        rec |= {"criterion": cert["criterion"], "k": cert["k"], "n_layer_before": cert["n_layer_before"],
                "layers_removed": cert["layers_removed"], "k_within_tolerance": cert["k_within_tolerance"],
                "input_format": cert["model"]["input_format"], "output_format": cert["model"]["format"],
                "eval_sha256": cert["eval_data"]["sha256"], "heldout_sequences": cert["eval_data"]["heldout_sequences"],
                "method": cert["method"],
                "domains": {s: {**{k: r[k] for k in ("n_sequences", "clean_loss", "pruned_loss", "delta", "upper_bound")},
                                **check["scopes"][s]} for s, r in cert["result"].items()},
                "check": {k: v for k, v in check.items() if k != "scopes"}}
    runs.append(rec)
dst = Path("reports/atlas/prune.json")
kept = [r for r in (json.loads(dst.read_text())["runs"] if dst.exists() else []) if r["model"] not in {x["model"] for x in runs}]
doc = {"why": "`depthlens prune` on every atlas model by path and on a depthlens checkpoint; each pruned model reloaded "
              "by its own loader (plain transformers for the HF directory written from a GGUF file) and its held-out "
              "loss recomputed outside depthlens' model code against the certificate",
       "reproduce": "bash scripts/real-model-prune.sh",
       "difference": "recomputed minus certified mean next-token NLL (nats/token), positions 0..T-2, held-out sequences",
       "runs": kept + runs}
fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".prune.json.")
with os.fdopen(fd, "w") as f:
    f.write(json.dumps(doc, indent=1) + "\n")
os.replace(tmp, dst)
bad = [r["model"] for r in runs if r["exit"] or "error" in r.get("check", {})]
worst = max((abs(d["pruned_loss_difference"]) for r in runs if r["model"] not in bad for d in r["domains"].values()), default=None)
print(f"real-model-prune: {len(runs) - len(bad)}/{len(runs)} pruned, largest |recomputed - certified| {worst} -> {dst}"
      + (f"; FAILED: {', '.join(bad)}" if bad else ""))
sys.exit(1 if bad else 0)
EOF

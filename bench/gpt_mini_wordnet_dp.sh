#!/usr/bin/env bash
# gpt-mini on the WordNet gloss corpus: 2 data-parallel ranks against 1 rank at the same
# global batch (issue 5, "Real data"). The demo's job (global batch 8 x 256 tokens, lr 1e-3,
# 20 warm-up steps, cosine schedule) run twice: `paratrain launch --nproc-per-node 2` with
# micro-batch 4 per rank, and one process with micro-batch 8. Prints both validation losses
# (every 100 steps and at the end) and their difference. Takes about 15 minutes on 2 cores.
#
#   bench/gpt_mini_wordnet_dp.sh [BUILD_DIR] [STEPS]
set -euo pipefail
BUILD_DIR=${1:-build/release}
STEPS=${2:-300}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DATA="$ROOT/demo-out/data"
if [ ! -f "$DATA/train.bin" ]; then
  DATA="$WORK/data"
  "$BIN" data prepare --wordnet --vocab-size 4096 --out "$DATA" > "$WORK/prepare.log" 2>&1 || { cat "$WORK/prepare.log"; exit 1; }
fi
TRAIN=(train --model gpt-mini --data "$DATA/train.bin" --val-data "$DATA/val.bin" --steps "$STEPS" --lr 1e-3
       --warmup-steps 20 --eval-every 100 --eval-batches 20 --quiet)
"$BIN" launch --nproc-per-node 2 -- "$BIN" "${TRAIN[@]}" --micro-batch 4 --metrics "$WORK/two.jsonl" > "$WORK/two.log" 2>&1 \
  || { cat "$WORK/two.log"; exit 1; }
"$BIN" "${TRAIN[@]}" --micro-batch 8 --metrics "$WORK/one.jsonl" 2> "$WORK/one.log" || { cat "$WORK/one.log"; exit 1; }
/usr/bin/python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
def evals(name):
    return {j["step"]: j["val_loss"] for j in map(json.loads, open(f"{work}/{name}.jsonl")) if j.get("eval")}
one, two = evals("one"), evals("two")
print(f"{'step':>6}{'1 rank x 8':>14}{'2 ranks x 4':>14}{'difference':>12}")
for s in sorted(one):
    print(f"{s:6d}{one[s]:14.4f}{two[s]:14.4f}{two[s] - one[s]:12.4f}")
PY

#!/usr/bin/env bash
# `make demo`: a real default job. Prepares the WordNet gloss corpus (Debian's wordnet-base)
# with a 4096-token BPE tokenizer, trains gpt-mini on it, evaluates on the held-out split,
# saves the model (safetensors) and prints a sample.
set -euo pipefail
BIN=${1:-build/release/bin/paratrain}
OUT=${DEMO_OUT:-demo-out}
STEPS=${DEMO_STEPS:-300}
mkdir -p "$OUT"

if [ ! -f "$OUT/data/train.bin" ]; then
  echo "== preparing the WordNet gloss corpus"
  "$BIN" data prepare --wordnet --vocab-size 4096 --out "$OUT/data"
fi

echo "== training gpt-mini for $STEPS steps on 2 processes (paratrain launch, data parallel)"
"$BIN" launch --nproc-per-node 2 -- "$BIN" train --model gpt-mini --data "$OUT/data/train.bin" --val-data "$OUT/data/val.bin" \
  --steps "$STEPS" --micro-batch 4 --lr 1e-3 --warmup-steps 20 --eval-every 100 --eval-batches 20 \
  --metrics "$OUT/metrics.jsonl" --save-final "$OUT/gpt-mini.safetensors"

echo "== sample"
"$BIN" sample --model "$OUT/gpt-mini.safetensors" --tokenizer "$OUT/data/tokenizer.model" \
  --prompt "a small" --max-tokens 60 --temperature 0.7

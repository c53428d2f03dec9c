#!/usr/bin/env bash
# Data-parallel scaling, paratrain against PyTorch DDP, in one run (issue 5's Speed section).
#
#   bench/train_ddp_gpt_mini.sh [BUILD_DIR]
#
# gpt-mini, micro-batch 8 per rank, f32, AdamW, 1 thread per rank: paratrain 1 rank x 1
# thread, paratrain 2 ranks x 1 thread under `paratrain launch`, PyTorch DDP (gloo) 1 x 1 and
# 2 x 1, PyTorch tuned as bench/torch_env.sh describes. Prints tokens/s (whole global batch),
# scaling efficiency (2-rank tokens/s over twice the 1-rank tokens/s), the fraction of
# communication left exposed after overlap, and peak RSS per rank.
set -euo pipefail
BUILD_DIR=${1:-build/release}
STEPS=${STEPS:-8}
WARMUP=3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")
echo "gpt-mini, micro-batch 8 per rank, f32, AdamW, 1 thread per rank, $WARMUP warm-up + $STEPS timed steps"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"
TRAIN=(train --model gpt-mini --data "$DATA" --micro-batch 8 --steps $((WARMUP + STEPS)) --threads 1
       --lr-schedule constant --grad-clip 0 --quiet)

"$BIN" "${TRAIN[@]}" --metrics "$WORK/pt1.jsonl" 2> "$WORK/pt1.log" || { cat "$WORK/pt1.log"; exit 1; }
"$BIN" launch --nproc-per-node 2 -- "$BIN" "${TRAIN[@]}" --metrics "$WORK/pt2.jsonl" > "$WORK/pt2.log" 2>&1 \
  || { cat "$WORK/pt2.log"; exit 1; }
for n in 1 2; do
  "$ROOT/bench/torch_env.sh" /usr/bin/python3 "$ROOT/bench/torch_ddp_train.py" --nproc $n --threads 1 \
    --micro-batch 8 --steps "$STEPS" --warmup-steps "$WARMUP" --data "$DATA" 2>/dev/null | tail -1 > "$WORK/torch$n.json"
done

/usr/bin/python3 - "$WORK" "$WARMUP" <<'PY'
import json, sys
work, warmup = sys.argv[1], int(sys.argv[2])
def ours(name):
    lines = [json.loads(l) for l in open(f"{work}/{name}.jsonl") if '"eval"' not in l][warmup:]
    tps = sum(l["tokens_per_s"] * l["step_ms"] for l in lines) / sum(l["step_ms"] for l in lines)
    exposed = sum(l.get("exposed_comm_ms", 0) for l in lines) / sum(l["step_ms"] for l in lines)
    comm = sum(l.get("comm_ms", 0) for l in lines)
    hidden = 1 - sum(l.get("exposed_comm_ms", 0) for l in lines) / comm if comm > 0 else float("nan")
    mem = max(max(l["mem_peak_bytes"]) for l in lines)
    return tps, exposed, hidden, mem
p1, _, _, m1 = ours("pt1")
p2, exp2, hid2, m2 = ours("pt2")
t1 = json.loads(open(f"{work}/torch1.json").read())
t2 = json.loads(open(f"{work}/torch2.json").read())
print(f"{'':24}{'tokens/s':>10}{'scaling':>10}{'exposed comm':>14}{'peak MiB/rank':>15}")
print(f"{'paratrain 1 x 1':24}{p1:10.0f}{'':>10}{'':>14}{m1/2**20:15.0f}  (allocator peak)")
print(f"{'paratrain 2 x 1':24}{p2:10.0f}{p2/(2*p1):10.1%}{exp2:14.1%}{m2/2**20:15.0f}  (allocator peak)")
print(f"{'pytorch DDP 1 x 1':24}{t1['tokens_per_s']:10.0f}{'':>10}{'':>14}{t1['peak_rss_bytes']/2**20:15.0f}  (RSS)")
print(f"{'pytorch DDP 2 x 1':24}{t2['tokens_per_s']:10.0f}{t2['tokens_per_s']/(2*t1['tokens_per_s']):10.1%}{'':>14}"
      f"{t2['peak_rss_bytes']/2**20:15.0f}  (RSS)")
print(f"ratio paratrain/pytorch at 2 x 1: {p2/t2['tokens_per_s']:.2f}x; communication hidden behind backward: {hid2:.0%}")
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Training throughput, paratrain against PyTorch, in one run (issue 2's Speed section).
#
#   bench/train_gpt_mini.sh [BUILD_DIR] [THREADS]
#
# Both train gpt-mini (6 layers, 6 heads, 384 wide, block 256, vocab 4096), micro-batch 8,
# f32, AdamW, on the same token file, with the same thread count, for 3 untimed warm-up
# steps and STEPS (default 10) timed steps. PyTorch runs at its best (bench/torch_env.sh:
# OpenBLAS with its AVX-512 kernels, glibc malloc not returning memory every step);
# paratrain runs as installed, with no environment settings. Prints tokens/s of each, the
# ratio, model FLOPs utilisation against a GEMM peak measured here, and peak memory (max
# RSS of each process).
set -euo pipefail
BUILD_DIR=${1:-build/release}
THREADS=${2:-2}
STEPS=${STEPS:-10}
WARMUP=3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")

echo "gpt-mini, micro-batch 8, f32, AdamW, $THREADS threads, $WARMUP warm-up + $STEPS timed steps"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- paratrain ----
/usr/bin/time -f "%M" -o "$WORK/pt_rss" "$BIN" train --model gpt-mini --data "$DATA" --micro-batch 8 \
  --steps $((WARMUP + STEPS)) --threads "$THREADS" --lr-schedule constant --grad-clip 0 --quiet \
  --metrics "$WORK/pt.jsonl" > /dev/null 2> "$WORK/pt.log" || { cat "$WORK/pt.log"; exit 1; }

# ---- PyTorch, tuned ----
"$ROOT/bench/torch_env.sh" /usr/bin/python3 "$ROOT/bench/torch_gpt_train.py" --preset gpt-mini --micro-batch 8 \
  --steps "$STEPS" --warmup-steps "$WARMUP" --threads "$THREADS" --data "$DATA" > "$WORK/torch.json"

/usr/bin/python3 - "$WORK" "$WARMUP" <<'PY'
import json, sys
work, warmup = sys.argv[1], int(sys.argv[2])
lines = [json.loads(l) for l in open(f"{work}/pt.jsonl") if '"eval"' not in l]
timed = lines[warmup:]
tokens = 8 * 256 * len(timed)
secs = sum(l["step_ms"] for l in timed) / 1e3
pt_tps = tokens / secs
pt_mfu = sum(l["mfu"] for l in timed) / len(timed)
pt_rss = int(open(f"{work}/pt_rss").read().split()[-1]) * 1024
pt_alloc_peak = max(l["mem_peak_bytes"][0] for l in timed)
t = json.loads(open(f"{work}/torch.json").read().strip().splitlines()[-1])
flops_tok = t["flops_per_token"]  # the same 6N + 12LCT formula as paratrain's mfu
# MFU of PyTorch against the same measured GEMM peak paratrain used.
peak = pt_tps * flops_tok / pt_mfu if pt_mfu > 0 else float("nan")
print(f"{'':12}{'tokens/s':>10}{'GFLOP/s':>10}{'MFU':>8}{'peak RSS MiB':>14}")
print(f"{'paratrain':12}{pt_tps:10.0f}{pt_tps*flops_tok/1e9:10.1f}{pt_mfu:8.1%}{pt_rss/2**20:14.0f}")
print(f"{'pytorch':12}{t['tokens_per_s']:10.0f}{t['tokens_per_s']*flops_tok/1e9:10.1f}"
      f"{t['tokens_per_s']*flops_tok/peak:8.1%}{t['peak_rss_bytes']/2**20:14.0f}")
print(f"ratio paratrain/pytorch: tokens/s {pt_tps/t['tokens_per_s']:.2f}x, "
      f"peak memory {pt_rss/t['peak_rss_bytes']:.2f}x")
print(f"GEMM peak measured by paratrain: {peak/1e9:.0f} GFLOP/s; paratrain allocator peak "
      f"{pt_alloc_peak/2**20:.0f} MiB; flops/token {flops_tok/1e6:.1f} M")
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

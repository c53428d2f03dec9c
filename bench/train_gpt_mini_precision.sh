#!/usr/bin/env bash
# Mixed precision, paratrain fp32 / bf16 / fp16 against PyTorch's CPU autocast bf16, in one
# run (issue 10's Speed and memory section).
#
#   bench/train_gpt_mini_precision.sh [BUILD_DIR] [THREADS]
#
# gpt-mini, micro-batch 8, AdamW, THREADS (default 2) threads, the same token file; every run
# warms up to steady state (bench/train_gpt_mini.sh's rule) and times STEPS (default 10)
# steps; figures are the median step's. The PyTorch peer is torch.autocast("cpu",
# dtype=torch.bfloat16) around the forward of the fastest bf16 formulation measured
# (torch_gpt_formulations.FASTEST_BF16; PEER_FORMULATION=all measures them all in this run),
# tuned as bench/torch_env.sh does. On a CPU without native bf16 PyTorch's autocast takes
# about a minute per step here, so the peer times PEER_STEPS (default 3) steps after 2 of
# warm-up (it touches no fresh memory after the first).
#
# Prints tokens/s, peak RSS, paratrain's allocator peak and its activation memory (what a
# forward leaves allocated for the backward: mem_activation_bytes of the metrics), and the
# half-type GEMM path this CPU takes (native bf16 instructions or widening to f32).
set -euo pipefail
BUILD_DIR=${1:-build/release}
THREADS=${2:-2}
STEPS=${STEPS:-10}
PT_MAX_WARMUP=${PT_MAX_WARMUP:-8}
PEER_FORMULATION=${PEER_FORMULATION:-}
PEER_STEPS=${PEER_STEPS:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export ROOT
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")
echo "gpt-mini, micro-batch 8, AdamW, $THREADS threads, warm-up to steady state + $STEPS timed steps"
echo "cpu flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_bf16|avx512_fp16|amx_bf16)$' | tr '\n' ' ')"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"

for p in fp32 bf16 fp16; do
  /usr/bin/time -f "%M" -o "$WORK/$p.rss" "$BIN" train --model gpt-mini --data "$DATA" --micro-batch 8 \
    --steps $((PT_MAX_WARMUP + STEPS)) --threads "$THREADS" --lr-schedule constant --grad-clip 0 --quiet \
    --precision "$p" --metrics "$WORK/$p.jsonl" > "$WORK/$p.log" 2>&1 || { cat "$WORK/$p.log"; exit 1; }
done
"$BIN" doctor 2>/dev/null | grep "half-type GEMM path" > "$WORK/path.txt" || true

"$ROOT/bench/torch_env.sh" /usr/bin/python3 "$ROOT/bench/torch_gpt_train.py" --preset gpt-mini --micro-batch 8 \
  --steps "$PEER_STEPS" --warmup-steps 2 --max-warmup-steps 2 --threads "$THREADS" --data "$DATA" --precision bf16 \
  ${PEER_FORMULATION:+--formulation "$PEER_FORMULATION"} --rounds 1 > "$WORK/torch.json"

/usr/bin/python3 - "$WORK" "$STEPS" "$THREADS" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "bench"))
from bench_results import steady_steps, spread, row, record, median
work, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokens = 8 * 256
ours = {}
for p in ("fp32", "bf16", "fp16"):
    lines, warm = steady_steps(f"{work}/{p}.jsonl", steps)
    med, lo, hi = spread([l["step_ms"] for l in lines], tokens)
    ours[p] = {"tps": med, "lo": lo, "hi": hi,
               "rss": int(open(f"{work}/{p}.rss").read().split()[-1]) * 1024,
               "alloc_peak": max(l["mem_peak_bytes"][0] for l in lines),
               "act": median([l["mem_activation_bytes"] for l in lines]),
               "skipped": sum(1 for l in lines if l.get("skipped")),
               "loss": lines[-1]["loss"]}
t = json.loads(open(f"{work}/torch.json").read().strip().splitlines()[-1])
path = open(f"{work}/path.txt").read().strip() or "(paratrain doctor names no GEMM path)"
def line(name, tps, lo, hi, rss, alloc="", act="", note=""):
    rng = f"{lo:.0f} - {hi:.0f}"
    print(f"{name:26}{tps:9.0f}{rng:>19}{rss / 2**20:14.0f}{alloc:>16}{act:>17}{note}")
print(f"{'':26}{'tokens/s':>9}{'(slowest-fastest)':>19}{'peak RSS MiB':>14}{'alloc peak MiB':>16}{'activations MiB':>17}")
for p, o in ours.items():
    line("paratrain " + p, o["tps"], o["lo"], o["hi"], o["rss"], f"{o['alloc_peak'] / 2**20:.0f}", f"{o['act'] / 2**20:.1f}")
line("pytorch bf16 autocast", t["tokens_per_s"], t["tokens_per_s_min"], t["tokens_per_s_max"], t["peak_rss_bytes"],
     note=f"  ({t['formulation']})")
if "formulations" in t:
    print("pytorch bf16 formulations tried (tokens/s): " + ", ".join(f"{n} {v[0]:.0f}" for n, v in t["formulations"].items()))
print(f"half GEMM path on this CPU: {path}")
bf, f32, f16 = ours["bf16"], ours["fp32"], ours["fp16"]
print(f"bf16 / pytorch bf16: {bf['tps']/t['tokens_per_s']:.2f}x; bf16 / own fp32: {bf['tps']/f32['tps']:.2f}x; "
      f"fp16 / own fp32: {f16['tps']/f32['tps']:.2f}x; activations bf16 / fp32: {bf['act']/f32['act']:.2f}x; "
      f"fp16 steps skipped by the scaler: {f16['skipped']}")
native = "onednn-bf16-native" in path
b = f"precision gpt-mini {threads}t"
record("train_gpt_mini_precision", [
    row(b, "bf16 tokens/s", bf["tps"], t["tokens_per_s"], f"pytorch bf16 autocast ({t['formulation']})", 1.5, issue=10),
    row(b, "bf16 tokens/s", bf["tps"], f32["tps"], "paratrain fp32", 1.4 if native else 0.9, issue=10,
        note="native bf16 GEMM" if native else "no native bf16 on this CPU: floor 0.9x"),
    row(b, "fp16 tokens/s", f16["tps"], f32["tps"], "paratrain fp32", None),
    row(b, "activation MiB", bf["act"] / 2**20, f32["act"] / 2**20, "paratrain fp32", 0.6, "lower", issue=10),
])
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

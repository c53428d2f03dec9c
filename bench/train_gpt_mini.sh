#!/usr/bin/env bash
# Training throughput, paratrain against PyTorch, in one run (issue 2's Speed section, issue 9).
#
#   bench/train_gpt_mini.sh [BUILD_DIR] [THREADS]
#
# Both train gpt-mini (6 layers, 6 heads, 384 wide, block 256, vocab 4096), micro-batch 8,
# f32, AdamW, on the same token file, with the same thread count. Both warm up until they are
# in steady state (at least 3 steps, and until a step takes at most 200 minor page faults:
# PyTorch here needs about 6), then STEPS (default 12) timed steps; figures are the median
# step with the slowest and fastest step beside it.
#
# The peer is PyTorch at its best: bench/torch_env.sh's settings (OpenBLAS's own kernels,
# glibc malloc not returning memory every step) and the fastest formulation of the model
# (bench/torch_gpt_formulations.py). PEER_FORMULATION=all (the default) measures every
# formulation in this run, prints their tokens/s and races the fastest; PEER_FORMULATION=NAME
# races that one. paratrain runs as installed, with no environment settings.
#
# MFU is against the hardware's f32 peak (`paratrain bench compute`: FMA throughput of the
# cores at their real clock, a true upper bound); the measured GEMM peak and each side's
# fraction of it are printed beside it.
set -euo pipefail
BUILD_DIR=${1:-build/release}
THREADS=${2:-2}
STEPS=${STEPS:-12}
MAX_WARMUP=${MAX_WARMUP:-20}     # PyTorch's most warm-up steps
PT_MAX_WARMUP=${PT_MAX_WARMUP:-8}  # paratrain's (it reaches steady state after 1-2 steps)
PEER_FORMULATION=${PEER_FORMULATION:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export ROOT
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")

echo "gpt-mini, micro-batch 8, f32, AdamW, $THREADS threads, warm-up to steady state + $STEPS timed steps"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"

"$BIN" bench compute --threads "$THREADS" --json > "$WORK/peak.json"

# ---- paratrain: the timed steps follow the first steady step (bench_results.steady_steps) ----
/usr/bin/time -f "%M" -o "$WORK/pt_rss" "$BIN" train --model gpt-mini --data "$DATA" --micro-batch 8 \
  --steps $((PT_MAX_WARMUP + STEPS)) --threads "$THREADS" --lr-schedule constant --grad-clip 0 --quiet \
  --metrics "$WORK/pt.jsonl" > /dev/null 2> "$WORK/pt.log" || { cat "$WORK/pt.log"; exit 1; }

# ---- PyTorch, tuned ----
"$ROOT/bench/torch_env.sh" /usr/bin/python3 "$ROOT/bench/torch_gpt_train.py" --preset gpt-mini --micro-batch 8 \
  --steps "$STEPS" --max-warmup-steps "$MAX_WARMUP" --threads "$THREADS" --data "$DATA" \
  --formulation "$PEER_FORMULATION" --rounds 1 > "$WORK/torch.json"

/usr/bin/python3 - "$WORK" "$STEPS" "$THREADS" <<'PY'
import json, sys, os
sys.path.insert(0, os.path.join(os.environ.get("ROOT", "."), "bench"))
work, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from bench_results import steady_steps, spread, row, record, median
timed, warm = steady_steps(f"{work}/pt.jsonl", steps)
tokens = 8 * 256
pt_med, pt_lo, pt_hi = spread([l["step_ms"] for l in timed], tokens)
pt_rss = int(open(f"{work}/pt_rss").read().split()[-1]) * 1024
pt_alloc_peak = max(l["mem_peak_bytes"][0] for l in timed)
pt_mfu_metric = median([l["mfu"] for l in timed])
t = json.loads(open(f"{work}/torch.json").read().strip().splitlines()[-1])
peak = json.loads(open(f"{work}/peak.json").read())
hw, gemm = peak["hardware_peak_gflops"] * 1e9, peak["gemm_peak_gflops"] * 1e9
fpt = t["flops_per_token"]  # the same 6N + 12LCT formula as paratrain's mfu
to_med, to_lo, to_hi = t["tokens_per_s"], t["tokens_per_s_min"], t["tokens_per_s_max"]
print(f"{'':22}{'tokens/s':>9}{'(slowest-fastest step)':>24}{'GFLOP/s':>9}{'MFU':>7}{'of GEMM':>9}{'peak RSS MiB':>14}{'warm-up':>9}")
for name, med, lo, hi, rss, w in (("paratrain", pt_med, pt_lo, pt_hi, pt_rss, warm),
                                  (f"pytorch ({t['formulation']})", to_med, to_lo, to_hi, t["peak_rss_bytes"], t["warmup_steps_run"])):
    g = med * fpt
    print(f"{name:22}{med:9.0f}{f'{lo:.0f} - {hi:.0f}':>24}{g/1e9:9.1f}{g/hw:7.1%}{g/gemm:9.1%}{rss/2**20:14.0f}{w:9d}")
if "formulations" in t:
    print("pytorch formulations tried (tokens/s, median step): " +
          ", ".join(f"{n} {v[0]:.0f}" for n, v in t["formulations"].items()) + f"; raced: {t['formulation']}")
print(f"hardware f32 peak {hw/1e9:.1f} GFLOP/s ({peak['isa']}, {threads} threads, FMA throughput); "
      f"GEMM peak measured {gemm/1e9:.1f} GFLOP/s (best of f32 GEMMs up to {peak['gemm_peak_n']}^3) = "
      f"{gemm/hw:.1%} of the hardware peak")
print(f"paratrain's own metrics: mfu {pt_mfu_metric:.1%} (against its peak_flops {timed[0]['peak_flops']/1e9:.1f} GFLOP/s); "
      f"allocator peak {pt_alloc_peak/2**20:.0f} MiB; flops/token {fpt/1e6:.1f} M; "
      f"pytorch page faults per timed step {max(t['page_faults_per_step'])} at most")
print(f"ratio paratrain/pytorch: tokens/s {pt_med/to_med:.2f}x, peak memory {pt_rss/t['peak_rss_bytes']:.2f}x")
bench = f"train gpt-mini {threads}t"
record(f"train_gpt_mini_{threads}t", [
    row(bench, "tokens/s", pt_med, to_med, f"pytorch tuned ({t['formulation']})", 1.2, issue=2,
        note=f"spread {pt_lo:.0f}-{pt_hi:.0f} vs {to_lo:.0f}-{to_hi:.0f}"),
    row(bench, "peak RSS MiB", pt_rss / 2**20, t["peak_rss_bytes"] / 2**20, "pytorch tuned", 1.0, "lower", issue=2),
    row(bench, "MFU (hw peak)", pt_med * fpt / hw, to_med * fpt / hw, "pytorch tuned", None,
        note=f"hw peak {hw/1e9:.0f} GFLOP/s, GEMM peak {gemm/1e9:.0f} = {gemm/hw:.0%} of it"),
])
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

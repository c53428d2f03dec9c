#!/usr/bin/env bash
# Tensor parallelism (Megatron-style), one process against tp=2, in one run.
#
#   bench/train_tp_gpt_mini.sh [BUILD_DIR]
#
# gpt-mini, micro-batch 8, f32, AdamW, 1 thread per process, the same global batch (8
# sequences) in every row: paratrain 1 process x 1 thread, tp=2 x 1 thread under `paratrain
# launch`, and tp=2 with --sequence-parallel. The peer of the tp rows is the one-process run
# of this same script run, on the same token file as the other gpt-mini benches
# (bench/lib.sh). Prints tokens/s (median step, slowest and fastest beside it), the ratio
# tp2/one (the issue's floor: at least 1.7x), the time in the tensor-parallel collectives per
# step (rank 0's tp_comm_ms: the collectives' time including any wait for the peer) and its
# share of the step, tp_comm_bytes per step against the formula below, and the per-rank peak
# memory (largest rank's mem_peak_bytes, the allocator's peak) and its ratio to one process
# (floor: at most 0.6x).
#
# tp_comm_bytes counts each collective's full buffer per rank (nccl-tests' S). Per optimizer
# step, f32, N = B*T tokens per micro-batch, C width, L layers, K = grad_accum:
#   plain tp:        K * ((4L + 2) * N*C*4 + 3*N*4)
#     forward one all-reduce after the embedding and two per layer (after attn.c_proj and
#     mlp.c_proj); backward two per layer (the f before c_attn and c_fc) and one at the LM
#     head's input; the vocab-parallel loss's MAX of N floats and SUM of 2N floats.
#   --sequence-parallel: K * ((8L + 4) * N*C*4 + 3*N*4 + ((6L + 2)*C + T*C)*4)
#     each of those 4L+2 activation collectives becomes an all-gather or reduce-scatter (full
#     gathered buffer) in forward and its mirror in backward, so twice as many of the same
#     size; plus the all-reduce of the gradients of the parameters every rank holds whole
#     while it sees only its part of the sequence (f on parameters), once per micro-batch:
#     the LayerNorms' weights and biases (ln_1, ln_2 per layer and ln_f: (4L + 2) * C), the
#     row-parallel linears' biases (attn.c_proj, mlp.c_proj: 2L * C) and wpe (T * C).
#   (Both checked against runs with micro-batch 8 and with micro-batch 4 x grad-accum 2.)
#
# The tp ranks work in lockstep (each collective waits for the peer), so on a machine shared
# with other work a tp=2 run loses more than the one-process run: read the load printed
# before and after.
#
# Every run warms up until it is in steady state (bench_results.steady_steps: at least 3
# steps and two steps with at most 200 minor page faults each), then STEPS timed steps.
set -euo pipefail
BUILD_DIR=${1:-build/release}
STEPS=${STEPS:-10}
PT_MAX_WARMUP=${PT_MAX_WARMUP:-6}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export ROOT
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PARATRAIN_THREADS=1 OMP_NUM_THREADS=1

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")
echo "gpt-mini, micro-batch 8 (global batch 8 in every row), f32, AdamW, 1 thread per process, warm-up to steady state + $STEPS timed steps"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"
TRAIN=(train --model gpt-mini --data "$DATA" --micro-batch 8 --steps $((PT_MAX_WARMUP + STEPS)) --threads 1
       --lr-schedule constant --grad-clip 0 --quiet)

"$BIN" "${TRAIN[@]}" --metrics "$WORK/one.jsonl" 2> "$WORK/one.log" || { cat "$WORK/one.log"; exit 1; }
"$BIN" launch --nproc-per-node 2 -- "$BIN" "${TRAIN[@]}" --tp 2 --metrics "$WORK/tp2.jsonl" > "$WORK/tp2.log" 2>&1 \
  || { cat "$WORK/tp2.log"; exit 1; }
"$BIN" launch --nproc-per-node 2 -- "$BIN" "${TRAIN[@]}" --tp 2 --sequence-parallel --metrics "$WORK/tp2sp.jsonl" \
  > "$WORK/tp2sp.log" 2>&1 || { cat "$WORK/tp2sp.log"; exit 1; }

/usr/bin/python3 - "$WORK" "$STEPS" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "bench"))
from bench_results import steady_steps, spread, median, row, record
work, steps = sys.argv[1], int(sys.argv[2])
B, T, C, L, K = 8, 256, 384, 6, 1  # gpt-mini (block 256, width 384, 6 layers), micro-batch 8, no accumulation
N = B * T
act = N * C * 4
formula = {"tp2": K * ((4 * L + 2) * act + 3 * N * 4),
           "tp2sp": K * ((8 * L + 4) * act + 3 * N * 4 + ((6 * L + 2) * C + T * C) * 4)}
def ours(name):
    lines, warm = steady_steps(f"{work}/{name}.jsonl", steps)
    for l in lines:
        if "layout" in l and l["layout"].get("tp", 1) != (1 if name == "one" else 2):
            raise SystemExit(f"error: {name}: layout {l['layout']}")
    tokens = lines[0]["tokens_per_s"] * lines[0]["step_ms"] / 1e3  # the global batch's tokens
    med, lo, hi = spread([l["step_ms"] for l in lines], tokens)
    step_ms = median([l["step_ms"] for l in lines])
    comm_ms = median([l.get("tp_comm_ms", 0.0) for l in lines])
    share = comm_ms / step_ms
    nbytes = sorted({l.get("tp_comm_bytes", 0) for l in lines})
    calls = sorted({l.get("tp_comm_calls", 0) for l in lines})
    mem = max(max(l["mem_peak_bytes"]) for l in lines)
    return dict(tok=med, lo=lo, hi=hi, step_ms=step_ms, comm_ms=comm_ms, share=share, bytes=nbytes, calls=calls, mem=mem,
                warm=warm, tokens=tokens)
r = {n: ours(n) for n in ("one", "tp2", "tp2sp")}
one = r["one"]
names = {"one": "1 process x 1", "tp2": "tp=2 x 1", "tp2sp": "tp=2 x 1 seq-parallel"}
print(f"{'':24}{'tokens/s':>9}{'(slowest-fastest)':>19}{'vs one':>8}{'tp comm ms':>12}{'share':>7}"
      f"{'peak MiB/rank':>15}{'vs one':>8}")
for n, v in r.items():
    rng = f"{v['lo']:.0f} - {v['hi']:.0f}"
    vs = f"{v['tok'] / one['tok']:.2f}x" if n != "one" else ""
    cm = f"{v['comm_ms']:.1f}" if n != "one" else ""
    sh = f"{v['share']:.1%}" if n != "one" else ""
    mv = f"{v['mem'] / one['mem']:.2f}x" if n != "one" else ""
    print(f"{names[n]:24}{v['tok']:9.0f}{rng:>19}{vs:>8}{cm:>12}{sh:>7}{v['mem'] / 2**20:15.1f}{mv:>8}")
warmups = ", ".join(f"{names[n]} {v['warm']}" for n, v in r.items())
print(f"(warm-up steps: {warmups}; tp comm: rank 0's "
      f"time in the tensor-parallel collectives, median over the timed steps, waits for the peer included, and its share of the median step; peak: the "
      f"allocator's, largest rank)")
for n in ("tp2", "tp2sp"):
    v = r[n]
    x = v["tok"] / one["tok"]
    m = v["mem"] / one["mem"]
    print(f"{names[n]}: tokens/s {x:.2f}x one process (floor 1.7x): {'PASS' if x >= 1.7 else 'BELOW FLOOR'}; "
          f"peak memory per rank {m:.2f}x (floor 0.6x): {'PASS' if m <= 0.6 else 'ABOVE FLOOR'}")
for n, what in (("tp2", "K*((4L+2)*N*C*4 + 3*N*4)"),
                ("tp2sp", "K*((8L+4)*N*C*4 + 3*N*4 + ((6L+2)*C + T*C)*4)")):
    v, f = r[n], formula[n]
    meas = v["bytes"]
    verdict = "matches" if meas == [f] else f"differs by {meas[-1] - f:+,} bytes" + (
        f" (varies over steps: {meas})" if len(meas) > 1 else "")
    print(f"{names[n]}: tp_comm_bytes per step {meas[-1]:,} in {v['calls'][-1]} collectives; formula "
          f"{what} = {f:,}: {verdict}")
b = "tp gpt-mini tp=2 x 1"
bs = "tp gpt-mini tp=2 x 1 seq-par"
rows = []
for name, n in ((b, "tp2"), (bs, "tp2sp")):
    v = r[n]
    rows += [
        row(name, "tokens/s", v["tok"], one["tok"], "paratrain 1 process x 1", 1.7,
            note=f"spread {v['lo']:.0f}-{v['hi']:.0f} vs {one['lo']:.0f}-{one['hi']:.0f}"),
        row(name, "peak MiB/rank", v["mem"] / 2**20, one["mem"] / 2**20, "paratrain 1 process x 1", 0.6, "lower",
            note="allocator peak, largest rank"),
        row(name, "tp comm ms/step", v["comm_ms"], v["step_ms"], "median step ms (ratio: share)", None,
            "lower", note="rank 0, waits for the peer included"),
        row(name, "tp bytes/step", float(v["bytes"][-1]), float(formula[n]), "formula", None,
            note="matches" if v["bytes"] == [formula[n]] else "differs from the formula"),
    ]
record("train_tp_gpt_mini", rows)
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# ZeRO stages 0, 1, 2 and 3 side by side, 2 ranks x 1 thread, in one run (the issue "Fully
# sharded data parallelism: ZeRO stage 3").
#
#   bench/train_zero_gpt_mini.sh [BUILD_DIR]
#
# gpt-mini (6 layers, 384 wide, block 256, vocab 4096), f32, AdamW, 2 ranks under `paratrain
# launch --nproc-per-node 2`, 1 thread per rank, micro-batch 4 per rank: the same global batch
# (8 sequences) in every row, the global batch of bench/train_tp_gpt_mini.sh, on the same
# token file as the other gpt-mini benches (bench/lib.sh). The peer of every row is --zero 0
# (plain DDP) of this same run.
#
# Prints per stage: tokens/s (median step, slowest and fastest beside it) and its ratio to
# ZeRO 0 (the issue's floor for ZeRO 3: at least 0.9x); the model state per rank, i.e. the
# metrics' mem_param_bytes, mem_grad_bytes and mem_optimizer_bytes (each the largest rank's)
# and their sum, and its ratio to ZeRO 0 (floor for ZeRO 3: at most 0.55x); the allocator's
# peak per rank (mem_peak_bytes, largest rank: model state plus activations and transient
# buffers); the data-parallel communication per step (rank 0's comm_ms) and the part of it
# left exposed (exposed_comm_ms: not hidden behind compute); for ZeRO 3 the same split into
# the parameter all-gathers and the gradient reduce-scatters (the metrics' zero3 object),
# the gathers per step and the most units held gathered at once.
#
# Order against a noisy shared machine: the runs go 0, 3, 1, 2, 3, 0, so the two stages the
# floors compare are each run twice, at the same mean position in time (a load that rises or
# falls during the script biases neither), and a stage's speed is the best of its runs'
# medians (other work only ever slows a run down, so the faster run is the less disturbed
# one; pooling the two runs' steps would let one disturbed run drag the median). Its spread
# and communication times are that run's; the memory figures are the largest of all its runs.
# Each run's own median is printed on the "runs in order" line so a drift shows.
#
# Every run warms up until it is in steady state (bench_results.steady_steps: at least 3
# steps and two steps in a row with at most 200 minor page faults each), then STEPS timed
# steps. About 20 s a run on 2 cores, 6 runs.
set -euo pipefail
BUILD_DIR=${1:-build/release}
STEPS=${STEPS:-8}
PT_MAX_WARMUP=${PT_MAX_WARMUP:-8}
ORDER=${ORDER:-"0 3 1 2 3 0"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export ROOT
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PARATRAIN_THREADS=1 OMP_NUM_THREADS=1

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")
echo "gpt-mini, 2 ranks x 1 thread, micro-batch 4 per rank (global batch 8 in every row), f32, AdamW," \
     "warm-up to steady state + $STEPS timed steps; run order: $ORDER"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"
TRAIN=(train --model gpt-mini --data "$DATA" --micro-batch 4 --steps $((PT_MAX_WARMUP + STEPS)) --threads 1
       --lr-schedule constant --grad-clip 0 --quiet)

i=0
for z in $ORDER; do
  i=$((i + 1))
  name="run${i}_zero$z"
  "$BIN" launch --nproc-per-node 2 -- "$BIN" "${TRAIN[@]}" --zero "$z" --metrics "$WORK/$name.jsonl" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; exit 1; }
done

/usr/bin/python3 - "$WORK" "$STEPS" $ORDER <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "bench"))
from bench_results import steady_steps, spread, median, row, record
work, steps, order = sys.argv[1], int(sys.argv[2]), [int(z) for z in sys.argv[3:]]
MiB = 2**20
runs = []  # (stage, timed lines, warm-up steps), in run order
for i, z in enumerate(order, 1):
    lines, warm = steady_steps(f"{work}/run{i}_zero{z}.jsonl", steps)
    for l in lines:
        if l.get("zero", 0) != z or l.get("world_size") != 2:
            raise SystemExit(f"error: run {i}: zero {l.get('zero')} world {l.get('world_size')}, expected zero {z} on 2 ranks")
    runs.append((z, lines, warm))
tokens = {round(l["tokens_per_s"] * l["step_ms"] / 1e3) for _, lines, _ in runs for l in lines}  # the global batch's tokens
if len(tokens) != 1:
    raise SystemExit(f"error: the global batch differs between the runs: {sorted(tokens)} tokens")
tokens = tokens.pop()
def stage(z):
    mine = [lines for s, lines, _ in runs if s == z]
    best = max(mine, key=lambda lines: spread([l["step_ms"] for l in lines], tokens)[0])  # the fastest run's steps
    ls = [l for lines in mine for l in lines]  # every run's, for the memory figures
    med, lo, hi = spread([l["step_ms"] for l in best], tokens)
    def most(key):  # the largest rank's figure over the timed steps
        return max(max(l[key]) for l in ls)
    v = dict(tok=med, lo=lo, hi=hi, step_ms=median([l["step_ms"] for l in best]),
             param=most("mem_param_bytes"), grad=most("mem_grad_bytes"), opt=most("mem_optimizer_bytes"),
             state=max(p + g + o for l in ls for p, g, o in zip(l["mem_param_bytes"], l["mem_grad_bytes"],
                                                               l["mem_optimizer_bytes"])),
             peak=most("mem_peak_bytes"),
             comm=median([l.get("comm_ms", 0.0) for l in best]),
             exposed=median([l.get("exposed_comm_ms", 0.0) for l in best]), runs=len(mine))
    if z == 3:
        for k in ("gather_ms", "gather_exposed_ms", "reduce_scatter_ms", "reduce_scatter_exposed_ms"):
            v[k] = median([l["zero3"][k] for l in best])
        v["gathers"] = sorted({l["zero3"]["gathers"] for l in ls})
        v["units"] = max(l["zero3"]["peak_gathered_units"] for l in ls)
    return v
r = {z: stage(z) for z in sorted(set(order))}
if 0 not in r:
    raise SystemExit("error: ORDER has no --zero 0 run, the peer of every row")
base = r[0]
print(f"{'':8}{'tokens/s':>9}{'(slowest-fastest)':>19}{'vs 0':>7}{'params':>8}{'grads':>8}{'optim':>8}"
      f"{'state':>8}{'vs 0':>7}{'peak':>8}{'comm ms':>9}{'exposed':>9}")
print(f"{'':8}{'':>9}{'':>19}{'':>7}{'MiB/rank (largest rank)':>32}{'':>7}{'MiB/rank':>8}{'per step, rank 0':>18}")
for z, v in r.items():
    rng = f"{v['lo']:.0f} - {v['hi']:.0f}"
    vs = f"{v['tok'] / base['tok']:.2f}x" if z else ""
    ms = f"{v['state'] / base['state']:.2f}x" if z else ""
    print(f"{'zero ' + str(z):8}{v['tok']:9.0f}{rng:>19}{vs:>7}{v['param'] / MiB:8.1f}{v['grad'] / MiB:8.1f}"
          f"{v['opt'] / MiB:8.1f}{v['state'] / MiB:8.1f}{ms:>7}{v['peak'] / MiB:8.1f}{v['comm']:9.1f}{v['exposed']:9.1f}")
if 3 in r:
    v = r[3]
    print(f"zero 3 per step (rank 0, median): parameter all-gathers {v['gather_ms']:.1f} ms, exposed "
          f"{v['gather_exposed_ms']:.1f} ms; gradient reduce-scatters {v['reduce_scatter_ms']:.1f} ms, exposed "
          f"{v['reduce_scatter_exposed_ms']:.1f} ms; {'/'.join(map(str, v['gathers']))} gathers, at most "
          f"{v['units']} units gathered at once; median step {v['step_ms']:.0f} ms")
print("runs in order: " + ", ".join(
    f"zero {z} {spread([l['step_ms'] for l in lines], tokens)[0]:.0f} tokens/s (warm-up {warm})" for z, lines, warm in runs))
print(f"({tokens} tokens per step; tokens/s: the best of a stage's runs' medians, spread and comm from that run; state = "
      f"parameters + gradients + optimizer state, the metrics' mem_*_bytes; peak: the allocator's; exposed: the "
      f"communication not hidden behind compute)")
if 3 in r:
    v = r[3]
    x = v["tok"] / base["tok"]
    m = v["state"] / base["state"]
    print(f"zero 3: tokens/s {x:.2f}x zero 0 (floor 0.9x): {'PASS' if x >= 0.9 else 'BELOW FLOOR'}; "
          f"model state per rank {m:.2f}x (floor 0.55x): {'PASS' if m <= 0.55 else 'ABOVE FLOOR'}")
rows = []
for z, v in r.items():
    if z == 0:
        continue
    b = f"zero gpt-mini 2x1 zero {z}"
    floored = z == 3
    rows += [
        row(b, "tokens/s", v["tok"], base["tok"], "--zero 0 (plain DDP)", 0.9 if floored else None,
            note=f"best of {v['runs']} vs {base['runs']} runs; spread {v['lo']:.0f}-{v['hi']:.0f} vs {base['lo']:.0f}-{base['hi']:.0f}"),
        row(b, "model state MiB/rank", v["state"] / MiB, base["state"] / MiB, "--zero 0 (plain DDP)",
            0.55 if floored else None, "lower", note="params + grads + optimizer, largest rank"),
        row(b, "peak MiB/rank", v["peak"] / MiB, base["peak"] / MiB, "--zero 0 (plain DDP)", None, "lower",
            note="allocator peak, largest rank"),
    ]
    if z == 3:
        rows.append(row(b, "exposed comm ms/step", v["exposed"], v["step_ms"], "median step ms (ratio: share)", None,
                        "lower", note=f"gather {v['gather_exposed_ms']:.1f} of {v['gather_ms']:.1f}, reduce-scatter "
                                      f"{v['reduce_scatter_exposed_ms']:.1f} of {v['reduce_scatter_ms']:.1f}"))
record("train_zero_gpt_mini", rows)
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Pipeline parallelism (the issue "pipeline parallelism, the training layer, ..."): gpt-mini
# on 2 pipeline stages, 1 thread per rank, for each schedule and m = 4, 8, 16 micro-batches,
# beside one process (1 thread) training the same global batch in the same run.
#
#   bench/train_pp_gpt_mini.sh [BUILD_DIR]
#
# gpt-mini (6 layers, 384 wide, block 256, vocab 4096), f32, AdamW, micro-batch 1: the global
# batch is m sequences. Per (schedule, m) it prints: the measured bubble fraction (the
# metrics' bubble_fraction: 1 - the ranks' compute-action time / their schedule time, median
# over the timed steps) against the theory ((p - 1) / (v m + p - 1) with B = 2F; zb1p's from
# the schedule's simulation, `paratrain plan --print-schedule`), and against the same schedule
# simulated with the two ranks' measured compute (`--rank-costs`: gpt-mini's 6 blocks cut 3 | 3
# leave the LM head, about 0.9 of a block, on the last stage, so the stages are unequal and
# the equal-stage theory is not reachable); tokens/s and its ratio to one
# process at the same m; the peak activation memory per stage (mem_activation_bytes_per_rank,
# MiB: what the held micro-batches kept allocated). Floors from the issue: the measured bubble
# within 25% (relative) of the theory for gpipe and 1f1b; interleaved's and zb1p's below
# 1f1b's at the same m; pp=2 at m=16 at least 1.6x the one-process tokens/s.
#
# Each run warms up WARM steps (first touch of memory), then STEPS timed steps; a rate is the
# median step's. About 6 minutes on 2 cores.
set -euo pipefail
BUILD_DIR=${1:-build/release}
STEPS=${STEPS:-4}
WARM=${WARM:-3}
MS=${MS:-"4 8 16"}
SCHEDULES=${SCHEDULES:-"gpipe 1f1b interleaved zb1p"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export ROOT
BIN="$BUILD_DIR/bin/paratrain"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PARATRAIN_THREADS=1 OMP_NUM_THREADS=1

source "$ROOT/bench/lib.sh"
DATA=$(bench_token_file "$WORK")
echo "gpt-mini, pp 2 x 1 thread against 1 process x 1 thread, micro-batch 1, f32, AdamW; m = $MS;" \
     "warm-up + $STEPS timed steps"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg)"
TRAIN=(train --model gpt-mini --data "$DATA" --micro-batch 1 --steps $((WARM + STEPS)) --threads 1
       --lr-schedule constant --quiet)
for m in $MS; do
  "$BIN" "${TRAIN[@]}" --grad-accum "$m" --metrics "$WORK/one_m$m.jsonl" > "$WORK/one_m$m.log" 2>&1 ||
    { cat "$WORK/one_m$m.log"; exit 1; }
  for s in $SCHEDULES; do
    "$BIN" launch --nproc-per-node 2 -- "$BIN" "${TRAIN[@]}" --grad-accum "$m" --pp 2 --pp-schedule "$s" \
      --metrics "$WORK/pp_${s}_m$m.jsonl" > "$WORK/pp_${s}_m$m.log" 2>&1 || { cat "$WORK/pp_${s}_m$m.log"; exit 1; }
    "$BIN" plan --print-schedule --pp 2 --micro-batches "$m" --pp-schedule "$s" > "$WORK/theory_${s}_m$m.txt"
    # The same schedule simulated with the two stages' measured compute (the last also runs
    # the LM head: gpt-mini's 6 blocks cannot be cut into equal halves).
    costs=$(/usr/bin/python3 -c "
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])][-$STEPS:]
b = [sum(l['pp_busy_ms_per_rank'][r] for l in L) for r in range(2)]
print(f'{b[0] / min(b):.4f},{b[1] / min(b):.4f}')" "$WORK/pp_${s}_m$m.jsonl")
    "$BIN" plan --print-schedule --pp 2 --micro-batches "$m" --pp-schedule "$s" --rank-costs "$costs" \
      > "$WORK/weighted_${s}_m$m.txt"
  done
done

/usr/bin/python3 - "$WORK" "$STEPS" "$MS" "$SCHEDULES" "$WARM" <<'PY'
import os, re, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "bench"))
from bench_results import steady_steps, spread, median, row, record
work, steps, warm_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[5])
ms, schedules = [int(m) for m in sys.argv[3].split()], sys.argv[4].split()
MiB = 2**20
def rate(path):
    # The first WARM steps are warm-up (first touch of memory); the pipeline's stages never
    # all go quiet on page faults at once, so the rule is the step count alone.
    lines, warm = steady_steps(path, steps, min_warmup=warm_steps, steady_faults=10**12)
    tokens = round(lines[0]["tokens_per_s"] * lines[0]["step_ms"] / 1e3)
    return spread([l["step_ms"] for l in lines], tokens)[0], lines
print(f"{'schedule':12}{'m':>4}{'bubble':>8}{'theory':>8}{'rel':>7}{'unequal':>9}{'rel':>7}{'tokens/s':>10}"
      f"{'1 proc':>8}{'vs 1':>7}"
      f"{'act MiB s0':>11}{'s1':>6}")
res = {}
for m in ms:
    one, _ = rate(f"{work}/one_m{m}.jsonl")
    for s in schedules:
        tok, lines = rate(f"{work}/pp_{s}_m{m}.jsonl")
        bubble = median([l["bubble_fraction"] for l in lines])
        theory = float(re.search(r"theory ([0-9.]+)", open(f"{work}/theory_{s}_m{m}.txt").read()).group(1))
        weighted = float(re.search(r"scaled by [0-9. ]+: ([0-9.]+)", open(f"{work}/weighted_{s}_m{m}.txt").read()).group(1))
        act = [max(l["mem_activation_bytes_per_rank"][r] for l in lines) / MiB for r in range(2)]
        res[(s, m)] = dict(bubble=bubble, theory=theory, weighted=weighted, tok=tok, one=one, act=act)
        print(f"{s:12}{m:4}{bubble:8.3f}{theory:8.3f}{(bubble - theory) / theory:+7.0%}{weighted:9.3f}"
              f"{(bubble - weighted) / weighted:+7.0%}{tok:10.0f}{one:8.0f}{tok / one:6.2f}x{act[0]:11.1f}{act[1]:6.1f}")
print("(bubble: 1 - compute / schedule time over both ranks, median of the timed steps; theory: equal stages, "
      "B = 2F; unequal: the schedule simulated with the two ranks' measured compute, F:B 1:2; rel: measured against "
      "each; act: the most activation memory a stage held)")
rows = []
for (s, m), v in res.items():
    b = f"pp gpt-mini pp2 {s} m{m}"
    if s in ("gpipe", "1f1b"):
        rel = abs(v["bubble"] - v["theory"]) / v["theory"]
        rows.append(row(b, "bubble rel. error", rel, 1.0, "(the theory)", 0.25, "lower", judge="value",
                        note=f"measured {v['bubble']:.3f}, theory {v['theory']:.3f} (equal stages)"))
        relw = abs(v["bubble"] - v["weighted"]) / v["weighted"]
        rows.append(row(b, "bubble rel. error, unequal stages", relw, 1.0, "(the simulated schedule)", 0.25, "lower",
                        judge="value", note=f"measured {v['bubble']:.3f}, simulated {v['weighted']:.3f}"))
    if s in ("interleaved", "zb1p") and ("1f1b", m) in res:
        rows.append(row(b, "bubble", v["bubble"], res[("1f1b", m)]["bubble"], "1f1b at the same m", 1.0, "lower",
                        note=f"theory {v['theory']:.3f}"))
    rows.append(row(b, "tokens/s", v["tok"], v["one"], "1 process", 1.6 if m == 16 else None,
                    note=f"activations s0 {v['act'][0]:.1f} MiB, s1 {v['act'][1]:.1f} MiB"))
record("train_pp_gpt_mini", rows)
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

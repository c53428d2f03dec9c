#!/usr/bin/env bash
# gpu_check.sh: everything paratrain does on NVIDIA GPUs, on a machine that has them, in one
# run (under 8 minutes on one H200):
#   1. builds with the CUDA parts (-DPARATRAIN_CUDA=on) into build/gpu;
#   2. runs every GPU test (ctest -L gpu);
#      with several GPUs also the nccl all-reduce's bus bandwidth, NCCL's own and rank-ordered;
#   3. measures paratrain's CUDA kernels (gpu_kernels_bench) beside PyTorch's for the same
#      gpt2-124m shapes (torch_gpu_kernels.py) and prints the ratios;
#   4. trains gpt-mini and gpt2-124m in bf16 on one GPU, and with DDP on all GPUs, with
#      `paratrain train --device cuda` under each attention form of ATTENTION_FORMS (the
#      default, then PARATRAIN_CUDA_ATTENTION=flash and =tiles) beside PyTorch
#      (torch_gpu_train.py: SDPA, autocast, fused AdamW) on the same GPU: tokens/s, MFU and
#      peak memory; then a summary table with paratrain's tokens/s over PyTorch's and DDP's
#      scaling (N GPUs over N times one), and the host's waits for the GPU per step (the
#      metrics' host_waits), per attention form, and the fastest form;
#   5. where gpt2-124m's step goes on one GPU: a few steps under PARATRAIN_PROFILE=1 (each op's
#      GPU time, forward and backward, and the optimizer's), per attention form.
# Exits 1 when a test fails or a step that should work does not; prints what it skipped.
#
# Usage: bash bench/gpu_check.sh [BUILD_DIR]     (STEPS=200 MB_MINI=32 MB_124M=8 to change;
#        ATTENTION_FORMS="default flash tiles" the forms trained and profiled, "default" the
#        tables' own;
#        SKIP_BUILD=1 runs what BUILD_DIR already holds, built elsewhere for this GPU;
#        TESTS_BUDGET_S=300 stops the GPU tests there and goes on)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build/gpu}
STEPS=${STEPS:-200}
MB_MINI=${MB_MINI:-32}
MB_124M=${MB_124M:-8}
ATTENTION_FORMS=${ATTENTION_FORMS:-default flash tiles}
source "$ROOT/bench/lib.sh"
PY=python3                           # the tables: any Python
TORCH_PY=$(bench_python torch)       # the PyTorch peers: the Python that has torch
T0=$(date +%s)
status=0
say() { printf '\n== %s (t=%ss)\n' "$*" "$(( $(date +%s) - T0 ))"; }

say "GPUs"
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi): nothing to check" >&2
  exit 2
fi
NGPU=$(nvidia-smi -L | grep -c '^GPU')
grep -m1 'model name' /proc/cpuinfo

BIN=$BUILD/bin/paratrain
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x "$BIN" ] && [ -x "$BUILD/tests/test_gpu" ]; then
  say "build: skipped (SKIP_BUILD=1), running $BUILD's binaries"
else
  say "build (PARATRAIN_CUDA=on)"
  # NCCL where the toolkit has none: the one PyTorch's wheels bring (nvidia-nccl).
  if [ -z "${NCCL_ROOT:-}" ] && [ -n "$TORCH_PY" ]; then
    NCCL_ROOT=$("$TORCH_PY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null) || true
    export NCCL_ROOT
  fi
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
    -DPARATRAIN_CUDA=on > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target paratrain_cli test_gpu gpu_kernels_bench > "$BUILD.build.log" 2>&1 ||
    { tail -50 "$BUILD.build.log"; exit 1; }
fi
[ -n "$TORCH_PY" ] || echo "gpu_check: no Python with torch here: the PyTorch columns stay empty"
"$BIN" doctor 2>&1 | grep -E 'cuda' || true

say "GPU tests (ctest -L gpu)"
# The whole log stays in $BUILD/gpu_tests.log; CTEST_TIMEOUT (seconds per test, 240) and CTEST_J
# (tests at once, 4) to change. A collective that hangs fails at PARATRAIN_COMM_TIMEOUT_S (60 s
# here, not 300: the tests' collectives take milliseconds), naming the rank and the call,
# instead of eating the run's time. TESTS_BUDGET_S (seconds, unset: none) stops the step there,
# so that a run with a time limit (the device tool's) still reaches the training figures; the
# log keeps the tests that ran, and the check fails.
tests_rc=0
if command -v ctest > /dev/null; then
  (cd "$BUILD" && PARATRAIN_COMM_TIMEOUT_S=${PARATRAIN_COMM_TIMEOUT_S:-60} ${TESTS_BUDGET_S:+timeout "$TESTS_BUDGET_S"} \
    ctest -L gpu --no-tests=error --output-on-failure --timeout "${CTEST_TIMEOUT:-240}" -j "${CTEST_J:-4}" \
    > gpu_tests.log 2>&1)
else  # no CTest on the machine: the GPU tests' executable itself
  (cd "$BUILD/tests" && PARATRAIN_COMM_TIMEOUT_S=${PARATRAIN_COMM_TIMEOUT_S:-60} timeout "${TESTS_BUDGET_S:-1200}" \
    ./test_gpu > ../gpu_tests.log 2>&1)
fi || tests_rc=$?
[ "$tests_rc" -eq 0 ] || status=1
[ "$tests_rc" -eq 124 ] && echo "GPU tests: stopped at TESTS_BUDGET_S=${TESTS_BUDGET_S:-1200} s, when" \
  "$(grep -cE 'Test +#[0-9]+: ' "$BUILD/gpu_tests.log") had finished (the log has them)"
# The verdict, then the failures and the skipped tests by name, however many there are.
grep -E '^[0-9]+% tests passed|Total Test time' "$BUILD/gpu_tests.log" || tail -25 "$BUILD/gpu_tests.log"
sed -n '/The following tests FAILED/,$p' "$BUILD/gpu_tests.log"
echo "skipped ($(grep -c '(Skipped)' "$BUILD/gpu_tests.log")):"
grep '(Skipped)' "$BUILD/gpu_tests.log" | head -30

say "kernels: paratrain vs PyTorch (gpt2-124m shapes, cuda:0)"
"$BUILD/bin/gpu_kernels_bench" > "$BUILD/kernels_paratrain.jsonl" || status=1
${TORCH_PY:-false} "$ROOT/bench/torch_gpu_kernels.py" > "$BUILD/kernels_torch.jsonl" || echo "(PyTorch kernels did not run)"
"$PY" - "$BUILD/kernels_paratrain.jsonl" "$BUILD/kernels_torch.jsonl" <<'PY'
import json, sys
def load(p):
    try: return {(r["kernel"], r["dtype"]): r for r in map(json.loads, open(p)) if r}
    except OSError: return {}
ours, torch = load(sys.argv[1]), load(sys.argv[2])
print(f"{'kernel':28} {'dtype':5} {'paratrain ms':>12} {'TFLOP/s':>8} {'pytorch ms':>11} {'TFLOP/s':>8} {'speed vs torch':>14}")
for k, r in ours.items():  # a form in parentheses ("attention fwd (flash)") beside PyTorch's one
    t = torch.get(k) or torch.get((k[0].split(" (")[0], k[1]))
    ratio = f"{t['ms'] / r['ms']:.2f}x" if t and r["ms"] > 0 else "-"
    print(f"{k[0]:28} {k[1]:5} {r['ms']:12.4f} {r['tflops']:8.1f} {t['ms'] if t else float('nan'):11.4f} "
          f"{t['tflops'] if t else float('nan'):8.1f} {ratio:>14}")
PY

# train_paratrain MODEL MB NPROC [ATTENTION] -> a JSON line of the steady steps' figures, or a
# reason. ATTENTION (PARATRAIN_CUDA_ATTENTION) is the tables' default unless given; the line's
# impl is then "paratrain-ATTENTION".
train_paratrain() {
  local model=$1 mb=$2 np=$3 attn=${4:-} impl=paratrain${4:+-$4}
  local out="$BUILD/train_${1}_${3}gpu${4:+_$4}.metrics.jsonl" log="$BUILD/train_${1}_${3}gpu${4:+_$4}.log"
  rm -f "$out"
  local cmd=("$BIN" train --device cuda --precision bf16 --model "$model" --micro-batch "$mb" --steps "$STEPS"
             --data "$TOKENS" --metrics "$out" --quiet)
  if [ "$np" -gt 1 ]; then
    cmd=("$BIN" launch --nproc-per-node "$np" -- "${cmd[@]}")
  fi
  if env ${attn:+PARATRAIN_CUDA_ATTENTION=$attn} timeout 300 "${cmd[@]}" > "$log" 2>&1 && [ -s "$out" ]; then
    "$PY" - "$out" "$model" "$np" "$impl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l]
steady = rows[len(rows) // 4:]
print(json.dumps({"impl": sys.argv[4], "model": sys.argv[2], "gpus": int(sys.argv[3]),
                  "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in steady), 1),
                  "mfu": round(statistics.median(r.get("mfu", 0) for r in steady), 4),
                  "peak_mem_bytes": max(max(r.get("mem_peak_bytes", [0])) for r in rows), "loss": rows[-1]["loss"],
                  "host_waits": max(r.get("host_waits", -1) for r in steady)}))
PY
  else
    echo "paratrain train did not finish ($log):"
    tail -3 "$log"
    return 1
  fi
}

if [ "$NGPU" -gt 1 ]; then
  # The gradient all-reduce DDP depends on, over nccl on device buffers: NCCL's own ring and
  # the rank-ordered (--deterministic) mode, the same sizes, printed side by side.
  say "nccl all-reduce on $NGPU GPUs: NCCL's own vs rank-ordered (bench comm --device cuda)"
  for mode in "" "--deterministic"; do
    timeout 120 "$BIN" launch --nproc-per-node "$NGPU" -- "$BIN" bench comm --device cuda --min-bytes 1M \
      --max-bytes 256M --iters 10 --warmup 3 $mode 2>&1 | grep -v '^\[[1-9]' | sed 's/^\[0\] //' || status=1
  done
fi

say "training: paratrain vs PyTorch, bf16, $STEPS steps"
TOKENS=$(bench_token_file "$BUILD")
SUMMARY=$BUILD/train_summary.jsonl
: > "$SUMMARY"
for spec in "gpt-mini $MB_MINI" "gpt2-124m $MB_124M"; do
  set -- $spec
  for np in 1 $([ "$NGPU" -gt 1 ] && echo "$NGPU"); do
    echo "-- $1, micro-batch $2, $np GPU(s)"
    for attn in $ATTENTION_FORMS; do
      [ "$attn" = default ] && attn=""
      train_paratrain "$1" "$2" "$np" $attn | tee -a "$SUMMARY" || status=1
    done
    ${TORCH_PY:-false} "$ROOT/bench/torch_gpu_train.py" --model "$1" --micro-batch "$2" --steps "$((STEPS / 2))" --nproc "$np" |
      tee -a "$SUMMARY" || echo "(PyTorch training did not run)"
  done
done

# The issue's floors beside the figures: paratrain's tokens/s over PyTorch's on the same GPUs
# (>= 1.0 for gpt2-124m), and DDP's scaling, tokens/s on N GPUs over N times one GPU's (>= 0.9).
say "training summary"
"$PY" - "$SUMMARY" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if isinstance(r, dict) and "tokens_per_s" in r and "model" in r:
        runs[(r["impl"], r["model"], r["gpus"])] = r
print(f"{'model':10} {'gpus':>4} {'paratrain':16} {'tok/s':>10} {'pytorch tok/s':>14} {'ratio':>6} {'mfu':>6} "
      f"{'peak GiB':>8} {'DDP scaling':>11} {'waits/step':>10}")
for (impl, model, gpus), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
    if not impl.startswith("paratrain"):
        continue
    t = runs.get(("pytorch", model, gpus))
    one = runs.get((impl, model, 1))
    ratio = f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}" if t and t["tokens_per_s"] else "-"
    scaling = f"{r['tokens_per_s'] / (gpus * one['tokens_per_s']):.2f}" if gpus > 1 and one else "-"
    print(f"{model:10} {gpus:>4} {impl:16} {r['tokens_per_s']:>10.0f} {t['tokens_per_s'] if t else float('nan'):>14.0f} "
          f"{ratio:>6} {r['mfu']:>6.3f} {r['peak_mem_bytes'] / 2**30:>8.2f} {scaling:>11} {r.get('host_waits', -1):>10}")
# Which attention form to make the default: the fastest on gpt2-124m, one GPU (once its tests pass).
forms = {impl: r["tokens_per_s"] for (impl, model, gpus), r in runs.items()
         if impl.startswith("paratrain") and model == "gpt2-124m" and gpus == 1}
if forms:
    best = max(forms, key=forms.get)
    print(f"fastest attention form, gpt2-124m on one GPU: {best} ({forms[best]:.0f} tokens/s; "
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(forms.items())) + ")")
PY

# Each op's time on the GPU (the profiler waits for the GPU around every op): the table to read
# for what to speed up next.
for attn in $ATTENTION_FORMS; do
  [ "$attn" = default ] && attn=""
  say "where a gpt2-124m step goes (PARATRAIN_PROFILE=1, 6 steps, attention ${attn:-default})"
  log=$BUILD/profile_gpt2-124m${attn:+_$attn}.log
  if env PARATRAIN_PROFILE=1 ${attn:+PARATRAIN_CUDA_ATTENTION=$attn} timeout 180 "$BIN" train --device cuda \
      --precision bf16 --model gpt2-124m --micro-batch "$MB_124M" --steps 6 --data "$TOKENS" --quiet > "$log" 2>&1; then
    sed -n '/^op profile/,$p' "$log" | head -30
  else
    echo "the profiled run did not finish ($log):"
    tail -3 "$log"
    status=1
  fi
done

say "done: $( [ $status -eq 0 ] && echo all checks passed || echo SOME CHECKS FAILED )"
exit $status

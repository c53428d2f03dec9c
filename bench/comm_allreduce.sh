#!/usr/bin/env bash
# 2-rank all-reduce on this host: paratrain (shm) vs OpenMPI's MPI_Allreduce vs Gloo
# (torch.distributed), f32 sum, same sizes; plus a copy-bandwidth probe and the 2-rank
# all-reduce memory-bandwidth limit. Usage: bench/comm_allreduce.sh [BUILD_DIR]
# (needs BUILD_DIR/bin/comm_bench, comm_mpi_allreduce_bench, comm_copy_bw_bench).
set -euo pipefail
BUILD_DIR=${1:-build/release}
BIN="$BUILD_DIR/bin"
HERE=$(cd "$(dirname "$0")" && pwd)
MIN=${MIN_BYTES:-4096}
MAX=${MAX_BYTES:-67108864}
ITERS=${ITERS:-20}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "== paratrain allreduce (shm, 2 ranks)"
port=$((30000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PARATRAIN_TOKEN=bench \
    timeout 600 "$BIN/comm_bench" --op allreduce --backend shm --min-bytes "$MIN" --max-bytes "$MAX" \
    --iters "$ITERS" --warmup 3 --json "$OUT/pt$r.json" > "$OUT/pt$r.txt" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$OUT/pt0.txt"
python3 -c '
import json,sys
for l in open(sys.argv[1]):
    o=json.loads(l); print(o["bytes"], round(o["time_us"],2), round(o["busbw_gbps"],3))' "$OUT/pt0.json" > "$OUT/pt.tsv"

echo "== OpenMPI MPI_Allreduce (2 ranks, vader; malloc tuned so large buffers are not re-mapped)"
GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296 \
  timeout 600 mpirun -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader \
  "$BIN/comm_mpi_allreduce_bench" "$MIN" "$MAX" "$ITERS" | tee "$OUT/mpi.tsv"

echo "== Gloo (torch.distributed, 2 ranks)"
timeout 900 /usr/bin/python3 "$HERE/comm_gloo_allreduce.py" "$MIN" "$MAX" "$ITERS" | tee "$OUT/gloo.tsv"

echo "== copy bandwidth (2 threads, 64 MiB memcpy each)"
COPY=$("$BIN/comm_copy_bw_bench" 2)
echo "copy bandwidth, both cores: $COPY GB/s (bytes read + written)"

python3 - "$OUT" "$COPY" "$HERE" <<'PY'
import sys
out, copy = sys.argv[1], float(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from bench_results import row, record
def load(name):
    d = {}
    for line in open(f"{out}/{name}.tsv"):
        p = line.split()
        if len(p) == 3: d[int(p[0])] = (float(p[1]), float(p[2]))
    return d
pt, mpi, gloo = load("pt"), load("mpi"), load("gloo")
# A 2-rank all-reduce of S bytes per rank must at least read each rank's input (S) and write
# each rank's result (S) in main memory: 4S bytes in all, over the copy bandwidth of both cores
# (bytes read + written). The S/2 each way between the ranks passes through the 4 MiB shared
# staging ring per pair, which stays in cache, so it is not counted as memory traffic.
# busbw (factor 1 at n=2) = S/t, so the limit is copy / 4.
limit = copy / 4.0
print()
print(f"{'bytes':>10} {'paratrain':>10} {'openmpi':>10} {'gloo':>10} {'pt/mpi':>7} {'pt/gloo':>7}   (busbw GB/s; latency us at 4 KiB)")
for s in sorted(pt):
    p, m, g = pt[s], mpi.get(s, (0, 0)), gloo.get(s, (0, 0))
    r1 = p[1] / m[1] if m[1] else 0
    r2 = p[1] / g[1] if g[1] else 0
    print(f"{s:>10} {p[1]:>10.3f} {m[1]:>10.3f} {g[1]:>10.3f} {r1:>7.2f} {r2:>7.2f}   t_us pt {p[0]:.1f} mpi {m[0]:.1f} gloo {g[0]:.1f}")
big = max(pt)
print(f"\n2-rank all-reduce memory-bandwidth limit: {limit:.2f} GB/s busbw (copy {copy:.2f} GB/s / 4); "
      f"paratrain at {big} bytes reaches {pt[big][1] / limit:.0%} of it")
if 4096 in pt and 4096 in mpi:
    print(f"4 KiB latency: paratrain {pt[4096][0]:.1f} us, OpenMPI {mpi[4096][0]:.1f} us, gloo {gloo.get(4096,(0,0))[0]:.1f} us")
b = "allreduce 2 ranks shm"
rows = []
if big in mpi:
    rows.append(row(b, f"busbw GB/s {big >> 20} MiB", pt[big][1], mpi[big][1], "OpenMPI (tuned)", 2.0, issue=3))
if big in gloo:
    rows.append(row(b, f"busbw GB/s {big >> 20} MiB", pt[big][1], gloo[big][1], "Gloo", 1.0, issue=3))
if 4096 in pt and 4096 in mpi:
    rows.append(row(b, "latency us 4 KiB", pt[4096][0], mpi[4096][0], "OpenMPI (tuned)", 1.0, "lower", issue=3))
rows.append(row(b, f"busbw GB/s {big >> 20} MiB", pt[big][1], limit, "memory-bandwidth limit", None,
                note="fraction of the limit"))
record("comm_allreduce", rows)
PY

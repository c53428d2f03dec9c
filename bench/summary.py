#!/usr/bin/python3
"""The end of `make bench`: one table of every benchmark's figures beside its peer's, the
floor from its issue and pass/fail, and the same as JSON.

  bench/summary.py RESULTS_DIR OUT.json [FAILED_BENCHMARK ...]

RESULTS_DIR holds the rows the bench scripts recorded (bench/bench_results.py); OUT.json
(bench/results/latest.json from run_all.sh) is written atomically with the rows, the CPU
(model and vector flags), the commit and the date. A benchmark named after the directory
failed to run and is listed as such. Exits 0: benchmarks measure, they do not gate.
"""
import datetime
import glob
import json
import os
import subprocess
import sys


def cpu():
    model, flags = "?", []
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                have = set(line.split(":", 1)[1].split())
                flags = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in have]
    except OSError:
        pass
    return {"model": model, "flags": flags, "cores": os.cpu_count()}


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return ""


def fmt(v):
    if v is None or v != v:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    results, out = sys.argv[1], sys.argv[2]
    failed = sys.argv[3:]
    rows = []
    for p in sorted(glob.glob(os.path.join(results, "*.json"))):
        rows.extend(json.load(open(p)))
    c = cpu()
    print()
    print(f"################ summary  ({c['model']}, {c['cores']} cores, {' '.join(c['flags'])})")
    w = max([len(r["benchmark"]) for r in rows] + [20])
    m = max([len(r["metric"]) for r in rows] + [8])
    print(f"{'benchmark':{w}}  {'metric':{m}}  {'ours':>8}  {'peer':>8}  {'ratio':>6}  {'floor':>11}  result  peer")
    for r in rows:
        floor = "-" if r["floor"] is None else (">=" if r["better"] == "higher" else "<=") + fmt(r["floor"])
        if r["floor"] is not None and r.get("floor_on") == "ours":
            floor = "ours" + floor
        verdict = {True: "pass", False: "FAIL", None: "-"}[r["pass"]]
        print(f"{r['benchmark']:{w}}  {r['metric']:{m}}  {fmt(r['ours']):>8}  {fmt(r['peer']):>8}  "
              f"{fmt(r['ratio']):>6}  {floor:>11}  {verdict:6}  {r['peer_name']}"
              + (f"  ({r['note']})" if r.get("note") else ""))
    for f in failed:
        print(f"{f:{w}}  (the benchmark failed to run: see its output above)")
    n_pass = sum(1 for r in rows if r["pass"] is True)
    n_fail = sum(1 for r in rows if r["pass"] is False)
    print(f"{n_pass} passed, {n_fail} below their floor, {len(failed)} benchmarks failed to run")
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit(), "cpu": c, "rows": rows, "failed": failed}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, out)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""What the bench scripts share: paratrain's steady-state window, step statistics, and the
result rows that `make bench` sums up (bench/summary.py).

A result row is one figure of one benchmark beside its peer's:
  {"benchmark": "train gpt-mini 2 threads", "metric": "tokens/s", "ours": 1900.0,
   "peer": 1300.0, "peer_name": "pytorch (linear)", "ratio": 1.46, "floor": 1.2,
   "better": "higher", "issue": 2, "pass": true}
ratio is ours/peer; "better": "higher" passes when ratio >= floor, "lower" when ratio <=
floor; floor None means the figure is shown without a floor. With judge="ours" the floor
applies to our figure itself (e.g. a scaling efficiency of at least 0.95), the peer's figure
and the ratio are shown beside it. A script records its rows with
record(name, rows) into $BENCH_RESULTS_DIR/<name>.json when that variable is set (run_all.sh
sets it), and prints them either way.
"""
import json
import os
import sys


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def steady_steps(path, steps, min_warmup=3, steady_faults=200, quiet_steps=2):
    """The `steps` optimizer-step lines of a paratrain --metrics file that follow warm-up:
    at least min_warmup steps, the last quiet_steps of them each with at most steady_faults
    minor page faults (the same rule as the PyTorch peers). Returns (lines, warm-up steps)."""
    lines = [json.loads(line) for line in open(path) if '"eval"' not in line]
    def quiet(i):
        return lines[i].get("page_faults", 0) <= steady_faults
    warm = max(min_warmup, quiet_steps)
    while warm < len(lines) and not all(quiet(i) for i in range(warm - quiet_steps, warm)):
        warm += 1
    timed = lines[warm:warm + steps]
    if len(timed) < steps:
        raise SystemExit(f"error: {path}: {len(lines)} steps, fewer than {warm} warm-up + {steps} timed")
    return timed, warm


def spread(step_ms, items_per_step):
    """Median rate and its spread from per-step times: (median, slowest, fastest) items/s."""
    return (items_per_step / (median(step_ms) / 1e3), items_per_step / (max(step_ms) / 1e3),
            items_per_step / (min(step_ms) / 1e3))


def row(benchmark, metric, ours, peer, peer_name, floor, better="higher", issue=None, note="",
        judge="ratio"):
    ratio = ours / peer if peer else float("nan")
    judged = ratio if judge == "ratio" else ours
    ok = None
    if floor is not None and judged == judged:
        ok = judged >= floor if better == "higher" else judged <= floor
    return {"benchmark": benchmark, "metric": metric, "ours": ours, "peer": peer,
            "peer_name": peer_name, "ratio": ratio, "floor": floor, "floor_on": judge,
            "better": better, "issue": issue, "pass": ok, "note": note}


def record(name, rows):
    d = os.environ.get("BENCH_RESULTS_DIR")
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "-"}[r["pass"]]
        print(f"result: {r['benchmark']}: {r['metric']} ours {r['ours']:.4g}, {r['peer_name']} "
              f"{r['peer']:.4g}, ratio {r['ratio']:.3g} (floor {r['floor']}) {verdict}")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{name}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(rows, f)
    os.replace(tmp, os.path.join(d, f"{name}.json"))


if __name__ == "__main__":
    print(__doc__)
    sys.exit(0)

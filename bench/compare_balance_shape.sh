#!/usr/bin/env bash
# The balancer's overhead prior, side by side in one run (docs/benchmarks.md, "The shape"): hetra.torch
# (bench/python/mlp_bench.py --variant hetra) and `hetra run` (examples/fashion_mnist_hetero.toml) on
# emulated devices {1, 2, 4}, with HETRA_BALANCE_SHAPE=1 (the overhead pulled toward the rank's measured
# shape, the default) and =0 (toward 0, as before 2026-12-06) alternating within each round.
# Needs a quiet machine.
#   [ROUNDS=6] [STEPS=300] bench/compare_balance_shape.sh [BUILD]
# Prints one JSON line per run (samples/s over the steps after the warm-up, the last split), then
# per variant and prior the median and range of samples/s and the median of the paired ratios.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${ROUNDS:-6}
source "$root/bench/python/runs.sh"
tag() { "$python" -c "import json, sys
for line in sys.stdin:
    r = json.loads(line); r.update(round=$round, shape=$shape); print(json.dumps(r), flush=True)" |
  tee -a "$results"; }
for round in $(seq 1 "$rounds"); do
  for shape in 1 0; do
    export HETRA_BALANCE_SHAPE=$shape
    mlp_bench 3 1,2,4 --variant hetra | tag
    hetra_run_record | tag
  done
done
"$python" - "$results" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
for variant in sorted({r["variant"] for r in runs}):
    by = {(r["round"], r["shape"]): r for r in runs if r["variant"] == variant}
    for shape in (1, 0):
        v = [r["samples_per_s"] for (_, s), r in by.items() if s == shape]
        slow = sorted(r["split"][-1] for (_, s), r in by.items() if s == shape)
        print(f"{variant:10s} shape={shape}: median {statistics.median(v):.0f} samples/s "
              f"({min(v):.0f}-{max(v):.0f}), slowest device's last share {slow}")
    ratios = [by[(k, 1)]["samples_per_s"] / by[(k, 0)]["samples_per_s"]
              for k in {k for k, _ in by} if (k, 0) in by and (k, 1) in by]
    print(f"{variant:10s} shape=1 over shape=0, paired by round: median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")
PY

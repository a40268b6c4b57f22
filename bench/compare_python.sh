#!/usr/bin/env bash
# The Python comparison of docs/benchmarks.md (issue: hetra for PyTorch users), side by side in one
# run: the same MLP script (bench/python/mlp_bench.py) under DDP + Gloo with the equal split, DDP +
# Gloo with the proportional split, DDP on backend="hetra" (equal and proportional) and hetra.torch
# with its balancer, on emulated devices {1,2,4} and {1,1}, and one run where a device slows x3
# mid-run; beside them `hetra run` on the same model and devices (examples/fashion_mnist_hetero.toml)
# and hetra.torch with hetra.torch.optim.SGD (torch's SGD with hetra run's one-pass step).
# Needs a quiet machine: on a busy one the numbers measure the other load, not hetra.
#   [ROUNDS=3] [STEPS=300] bench/compare_python.sh [BUILD]   (BUILD: with tools/hetra/hetra, python/)
# Prints one JSON line per run (rank 0's) to stdout, tagged with its round, then the medians over
# rounds and the ratios the issue's targets name (taken within each round, then the median).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${ROUNDS:-1}
source "$root/bench/python/runs.sh"
run() { mlp_bench "$@" | tagged; }
tagged() { "$python" -c "import json, sys
for line in sys.stdin:
    r = json.loads(line); r['round'] = $round; print(json.dumps(r), flush=True)" | tee -a "$results"; }
hetra_run() { hetra_run_record | tagged; }
for round in $(seq 1 "$rounds"); do
  for slowdowns in 1,2,4 1,1; do
    np=$(($(tr -cd , <<<"$slowdowns" | wc -c) + 1))
    run "$np" "$slowdowns" --variant ddp-equal --backend gloo
    run "$np" "$slowdowns" --variant ddp-proportional --backend gloo
    run "$np" "$slowdowns" --variant ddp-equal --backend hetra
    run "$np" "$slowdowns" --variant ddp-proportional --backend hetra
    run "$np" "$slowdowns" --variant hetra
  done
  hetra_run
  # hetra.torch with hetra.torch.optim.SGD (torch's SGD with the one-pass step hetra run uses)
  run 3 1,2,4 --variant hetra --optimizer hetra
  # The heap's share: hetra's processes pin glibc's mmap and trim thresholds (src/device/
  # host_heap.h); the careful user's DDP on Gloo with the same thresholds, set through glibc's
  # own variables.
  MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483647 \
    run 3 1,2,4 --variant ddp-proportional --backend gloo --label "heap kept"
  # A device slows x3 a third of the way in: a static split cannot follow, the balancer can.
  change=$((steps / 3 + warmup)):0:3
  run 3 1,2,4 --change "$change" --variant ddp-proportional --backend gloo
  run 3 1,2,4 --change "$change" --variant hetra
done
"$python" "$root/bench/python/summarize_python.py" "$results"

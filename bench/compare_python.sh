#!/usr/bin/env bash
# The Python comparison of docs/benchmarks.md (issue: hetra for PyTorch users), side by side in one
# run: the same MLP script (bench/python/mlp_bench.py) under DDP + Gloo with the equal split, DDP +
# Gloo with the proportional split, DDP on backend="hetra" (equal and proportional) and hetra.torch
# with its balancer, on emulated devices {1,2,4} and {1,1}, and one run where a device slows x3
# mid-run. Needs a quiet machine with a core per rank: on a busy one the numbers measure the other
# load, not hetra.
#   bench/compare_python.sh [BUILD]        (BUILD: the build with tools/hetra/hetra and python/)
# Prints one JSON line per run (rank 0's) to stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
hetra=$build/tools/hetra/hetra
export PYTHONPATH=$build/python:$root/python${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1
python=${PYTHON:-/usr/bin/python3}
steps=${STEPS:-300}
run() {
  local np=$1; shift
  "$hetra" launch -np "$np" -- "$python" "$root/bench/python/mlp_bench.py" --steps "$steps" "$@"
}
for slowdowns in 1,2,4 1,1; do
  np=$(($(tr -cd , <<<"$slowdowns" | wc -c) + 1))
  run "$np" --slowdowns "$slowdowns" --variant ddp-equal --backend gloo
  run "$np" --slowdowns "$slowdowns" --variant ddp-proportional --backend gloo
  run "$np" --slowdowns "$slowdowns" --variant ddp-equal --backend hetra
  run "$np" --slowdowns "$slowdowns" --variant ddp-proportional --backend hetra
  run "$np" --slowdowns "$slowdowns" --variant hetra
done
# A device slows x3 a third of the way in: a static split cannot follow, the balancer can.
change=$((steps / 3 + 20)):0:3
run 3 --slowdowns 1,2,4 --change "$change" --variant ddp-proportional --backend gloo
run 3 --slowdowns 1,2,4 --change "$change" --variant hetra

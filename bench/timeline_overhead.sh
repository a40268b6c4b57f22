#!/usr/bin/env bash
# The cost of `hetra run --timeline`: alternating runs of one config without and with the
# timeline (so that a drift of the machine hits both alike), the final record's samples/s of each,
# and the mean ratio. The target is a loss of at most 1% (docs/metrics.md); it needs a quiet
# machine: on a shared one the spread between runs is larger than the effect.
#   bench/timeline_overhead.sh [CONFIG] [PAIRS]   (default: the make-demo MLP, 5 pairs)
set -euo pipefail
cd "$(dirname "$0")/.."
HETRA=${HETRA:-build/tools/hetra/hetra}
CONFIG=${1:-examples/fashion_mnist_hetero.toml}
PAIRS=${2:-5}
OUT=${OUT:-bench/out/timeline}
mkdir -p "$OUT"

final_rate() {  # the final record's samples_per_s
  grep '"event":"final"' "$1" | tail -1 | sed 's/.*"samples_per_s":\([0-9.e+-]*\).*/\1/'
}

printf '%5s %14s %14s %8s\n' pair without with ratio
ratios=()
for pair in $(seq 1 "$PAIRS"); do
  "$HETRA" run "$CONFIG" --metrics "$OUT/off-$pair.jsonl" >"$OUT/off-$pair.log" 2>&1
  "$HETRA" run "$CONFIG" --metrics "$OUT/on-$pair.jsonl" --timeline "$OUT/trace-$pair.json" \
    >"$OUT/on-$pair.log" 2>&1
  off=$(final_rate "$OUT/off-$pair.jsonl")
  on=$(final_rate "$OUT/on-$pair.jsonl")
  ratio=$(/usr/bin/python3 -c "print(f'{$on / $off:.4f}')")
  ratios+=("$ratio")
  printf '%5s %14.0f %14.0f %8s\n' "$pair" "$off" "$on" "$ratio"
done
/usr/bin/python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = [float(x) for x in sys.argv[1:]]
spread = statistics.stdev(r) if len(r) > 1 else float("nan")
print(f"with/without samples/s: mean {statistics.mean(r):.4f}, median {statistics.median(r):.4f}, "
      f"stdev {spread:.4f} over {len(r)} pairs (overhead = 1 - ratio)")
PY

#!/usr/bin/env bash
# What memory accounting costs (docs/memory.md, docs/benchmarks.md): whole runs of the demo
# (examples/fashion_mnist_hetero.toml, its memory cap lifted so that both settings run the same
# config) with HETRA_MEMORY_ACCOUNTING=1 and =0, alternating, the order flipped every pair so that
# a drift of the machine's speed falls on both alike. Prints each pair's samples/s (the final
# record's, averaged after the warm-up) and the ratio on/off, then the ratios' median and range.
# Needs a quiet machine: on a busy one the spread of the pairs is larger than the cost measured.
#   bench/compare_accounting.sh [PAIRS]            (default 5 pairs of whole demo runs)
#   STEPS=12 bench/compare_accounting.sh 1         a check of the script, no measurement
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-5}
HETRA=$(realpath "${HETRA:-build/tools/hetra/hetra}")
CONFIG=$(realpath "${CONFIG:-examples/fashion_mnist_hetero.toml}")
OUT=${OUT:-bench/out/accounting}
mkdir -p "$OUT"

sets=(--set devices.2.memory=unlimited --set train.log_every=0)
[[ -n ${STEPS:-} ]] && sets+=(--set train.steps="$STEPS" --set train.warmup_steps=$((STEPS / 4)) --set train.eval_every=0)

# samples_per_s ACCOUNTING NAME: one whole run; prints its samples/s.
samples_per_s() {
  local metrics="$OUT/$2.jsonl"
  rm -f "$metrics"
  HETRA_MEMORY_ACCOUNTING=$1 "$HETRA" run "$CONFIG" "${sets[@]}" --metrics "$metrics" \
    >"$OUT/$2.log" 2>&1 || { echo "run $2 failed, see $OUT/$2.log" >&2; return 1; }
  /usr/bin/python3 -c '
import json, sys
final = [r for r in map(json.loads, open(sys.argv[1])) if r["event"] == "final"]
print(final[-1]["samples_per_s"])' "$metrics"
}

echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, $(basename "$CONFIG") ${STEPS:+(STEPS=$STEPS: a check, not a measurement)}"
printf '%-5s %14s %14s %9s\n' pair "on samples/s" "off samples/s" "on/off"
ratios=()
for ((pair = 1; pair <= PAIRS; ++pair)); do
  if ((pair % 2)); then
    on=$(samples_per_s 1 "on-$pair")
    off=$(samples_per_s 0 "off-$pair")
  else
    off=$(samples_per_s 0 "off-$pair")
    on=$(samples_per_s 1 "on-$pair")
  fi
  ratio=$(/usr/bin/python3 -c "print(f'{$on / $off:.4f}')")
  ratios+=("$ratio")
  printf '%-5s %14.1f %14.1f %9s\n' "$pair" "$on" "$off" "$ratio"
done
/usr/bin/python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print(f"on/off: median {statistics.median(r):.4f}, min {r[0]:.4f}, max {r[-1]:.4f} "
      f"over {len(r)} pair{'s' if len(r) != 1 else ''} (1.0000: no cost; 0.99: accounting costs 1%)")
PY

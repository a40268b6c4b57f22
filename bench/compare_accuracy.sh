#!/usr/bin/env bash
# Accuracy of a heterogeneous run against a single-process run of the same config (same global
# batch, epochs, seed, optimizer): the config's [[devices]] are replaced by one device. Prints the
# final test accuracy of each and the difference in points.
#   bench/compare_accuracy.sh [CONFIG...]   (default: the make-demo MLP and the CNN example)
set -euo pipefail
cd "$(dirname "$0")/.."
HETRA=${HETRA:-build/tools/hetra/hetra}
OUT=${OUT:-bench/out/accuracy}
mkdir -p "$OUT"
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(examples/fashion_mnist_hetero.toml examples/fashion_mnist_cnn.toml)

final_accuracy() {  # the last eval record's test accuracy
  grep '"event":"eval"' "$1" | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/'
}

printf '%-40s %10s %10s %8s\n' config hetero single points
for config in "${configs[@]}"; do
  name=$(basename "$config" .toml)
  single="$OUT/$name-single.toml"
  # Everything before the first [[devices]] table, then one 1-thread device.
  sed '/^\[\[devices\]\]/,$d' "$config" >"$single"
  printf '\n[[devices]]\nname = "single"\nthreads = 1\n' >>"$single"
  "$HETRA" run "$config" --metrics "$OUT/$name-hetero.jsonl" >"$OUT/$name-hetero.log" 2>&1
  "$HETRA" run "$single" --metrics "$OUT/$name-single.jsonl" >"$OUT/$name-single.log" 2>&1
  a=$(final_accuracy "$OUT/$name-hetero.jsonl")
  b=$(final_accuracy "$OUT/$name-single.jsonl")
  printf '%-40s %10s %10s %8s\n' "$config" "$a" "$b" "$(python3 -c "print(f'{($a - $b) * 100:+.2f}')")"
done

#!/usr/bin/env bash
# Final test accuracy of the make-demo MLP (examples/fashion_mnist_hetero.toml) with every gradient
# allreduce compressed (comm.compression_min_bytes = 0), with and without error feedback, against
# float32 with the same seed; plus the payload bytes each rank sent per step (metrics bytes_sent).
#   bench/compare_compression.sh [CONFIG]
set -euo pipefail
cd "$(dirname "$0")/.."
HETRA=${HETRA:-build/tools/hetra/hetra}
CONFIG=${1:-examples/fashion_mnist_hetero.toml}
OUT=${OUT:-bench/out/compression}
mkdir -p "$OUT"

printf '%-24s %9s %8s %16s\n' compression accuracy points "bytes_sent/step"
base=""
for variant in none fp16 bf16 fp8-e4m3:ef fp8-e5m2:ef fp8-e5m2:noef; do
  codec=${variant%%:*}
  feedback=true
  [[ $variant == *:noef ]] && feedback=false
  name=${variant/:/-}
  "$HETRA" run "$CONFIG" --set comm.compression="\"$codec\"" --set comm.error_feedback=$feedback \
    --set comm.compression_min_bytes=0 --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1
  python3 - "$OUT/$name.jsonl" "$variant" "$base" <<'PY'
import json, sys
path, variant, base = sys.argv[1:]
records = [json.loads(line) for line in open(path)]
acc = [r for r in records if r.get("event") == "eval"][-1]["test_accuracy"]
steps = [r for r in records if r.get("event") == "step"]
sent = sum(rank["bytes_sent"] for r in steps for rank in r["ranks"]) / len(steps) / len(steps[0]["ranks"])
points = f"{(acc - float(base)) * 100:+.2f}" if base else ""
print(f"{variant:24s} {acc:9.4f} {points:>8s} {sent:16.0f}")
open(path + ".acc", "w").write(str(acc))
PY
  [[ -n $base ]] || base=$(cat "$OUT/$name.jsonl.acc")
done

#!/usr/bin/env bash
# Fewer synchronisations on a slow link: the make-demo MLP (examples/fashion_mnist_hetero.toml,
# devices "fast" and "half" on host h0, "quarter" on h1) across two network-namespace hosts joined
# by RATE (scripts/netns-cluster.sh; needs root). Synchronous data parallelism in float32 and with
# fp8 between the hosts (hierarchical, error feedback: the strongest synchronous peer) against
# periodic averaging every H = 2, 4, 8 steps (train.sync_every, the same fp8 hierarchical
# averaging, synchronous for the first train.sync_warmup_steps). Prints per run the training time
# to TARGET test accuracy (the step records' step_time_s summed up to the first evaluation that
# reaches it; evaluations themselves not counted) and the final accuracy. Needs a quiet machine.
#   bench/compare_periodic.sh [RATE] [TARGET]      (defaults: 100mbit, 0.87)
#   STEPS=16 EVAL_EVERY=8 bench/compare_periodic.sh 100mbit 0.5   a check of the script, no measurement
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-100mbit}
TARGET=${2:-0.87}
HETRA=$(realpath "${HETRA:-build/tools/hetra/hetra}")
CONFIG=$(realpath "${CONFIG:-examples/fashion_mnist_hetero.toml}")
OUT=${OUT:-bench/out/periodic}
WARMUP=${WARMUP:-50}
mkdir -p "$OUT"
source bench/netns_hosts.sh
hosts_up "$RATE"

common=(--set train.eval_every="${EVAL_EVERY:-40}" --set train.log_every=0)
# A short check: the demo's 50 warm-up steps (learning rate and synchronous) would fill it.
if [[ -n ${STEPS:-} ]]; then
  common+=(--set train.steps="$STEPS" --set train.warmup_steps=$((STEPS / 4)))
  WARMUP=$((STEPS / 4))
fi
fp8=(--set 'comm.compression="fp8-e4m3"' --set comm.error_feedback=true
  --set 'topology.algorithm="hierarchical"')

# run NAME SETS...: one training job, ranks 0 and 1 on h0, rank 2 on h1; then its row.
run() {
  local name=$1
  shift
  rm -f "$OUT/$name.jsonl"
  run_ranks "$OUT/$name" 3 2 HETRA_LOG=warn -- \
    "$HETRA" run "$CONFIG" "${common[@]}" "$@" --metrics "$OUT/$name.jsonl" || return 1
  python3 - "$name" "$OUT/$name.jsonl" "$TARGET" <<'PY'
import json, sys
name, path, target = sys.argv[1], sys.argv[2], float(sys.argv[3])
records = [json.loads(line) for line in open(path)]
steps = [r for r in records if r["event"] == "step"]
evals = [r for r in records if r["event"] == "eval"]
reached = "-"
for e in evals:
    if e["test_accuracy"] >= target:
        reached = f"{sum(s['step_time_s'] for s in steps if s['step'] <= e['step']):.1f} s"
        break
train_s = sum(s["step_time_s"] for s in steps)
print(f"{name:16s} to {target}: {reached:>9s}  final accuracy {evals[-1]['test_accuracy']:.4f}  "
      f"training {train_s:.1f} s over {steps[-1]['step']} steps")
PY
}

echo "# $(date -u +%F' '%H:%M) UTC, $RATE between 2 namespace hosts, $(basename "$CONFIG")"
run sync-fp32 --set 'comm.compression="none"'
run sync-fp8-hier "${fp8[@]}"
for h in 2 4 8; do
  run "periodic-h$h" "${fp8[@]}" --set train.sync_every=$h --set train.sync_warmup_steps="$WARMUP"
done

#!/usr/bin/env bash
# A device that costs more than it adds (docs/benchmarks.md, "Leaving a device out"): `hetra run`
# on the make-demo MLP with a fast device and one slowed by each factor in SLOWDOWNS, with the
# balancer allowed to leave the slow one out (balance.leave_out = true, the default) and not
# (false), beside the fast device alone; then the demo cluster {1, 2, 4} with and without a fourth
# device of the largest factor. Alternating within each round. Needs a quiet machine.
#   [ROUNDS=3] [STEPS=300] [SLOWDOWNS="4 8 16 32"] bench/compare_leave_out.sh [BUILD]
# Prints one JSON line per run: samples/s over the steps after a warm-up of 20 (the balancer's
# profiling and its decision included in the warm-up), the whole run's wall seconds (profiling
# included), the last split; then per configuration the medians over the rounds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
hetra=$build/tools/hetra/hetra
python=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-3}
steps=${STEPS:-300}
slowdowns=${SLOWDOWNS:-4 8 16 32}
warmup=20
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results.jsonl

# config NAME SLOWDOWN...: the make-demo MLP (examples/fashion_mnist_hetero.toml's model and
# training) on one single-threaded device per factor.
config() {
  local name=$1 i=0
  shift
  sed -n '/^\[model\]/,/^\[\[devices\]\]/p' "$root/examples/fashion_mnist_hetero.toml" |
    sed '$d' >"$work/$name.toml"
  for s in "$@"; do
    printf '\n[[devices]]\nname = "d%d-x%s"\nthreads = 1\nslowdown = %s\n' "$i" "$s" "$s" \
      >>"$work/$name.toml"
    i=$((i + 1))
  done
}

# run NAME LEAVE_OUT ROUND: one run, its JSON line appended to the results.
run() {
  local name=$1 leave=$2 round=$3 metrics=$work/metrics.jsonl start end
  rm -f "$metrics"
  start=$(date +%s.%N)
  "$hetra" run "$work/$name.toml" --set train.steps=$((warmup + steps)) --set train.eval_every=0 \
    --set balance.leave_out="$leave" --metrics "$metrics" >/dev/null
  end=$(date +%s.%N)
  "$python" -c "import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get('event') == 'step']
after = steps[$warmup:]
print(json.dumps({'config': '$name', 'leave_out': '$leave', 'round': $round,
                  'samples_per_s': round(sum(r['samples'] for r in after)
                                         / sum(r['step_time_s'] for r in after), 1),
                  'run_s': round($end - $start, 2),
                  'split': [r['batch'] for r in steps[-1]['ranks']]}))" "$metrics" |
    tee -a "$results"
}

largest=${slowdowns##* }
config alone 1
config demo 1 2 4
config "demo+x$largest" 1 2 4 "$largest"
for s in $slowdowns; do config "fast+x$s" 1 "$s"; done
for round in $(seq 1 "$rounds"); do
  run alone true "$round"
  for s in $slowdowns; do
    run "fast+x$s" true "$round"
    run "fast+x$s" false "$round"
  done
  run demo true "$round"
  run "demo+x$largest" true "$round"
  run "demo+x$largest" false "$round"
done

"$python" - "$results" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
keys = []
for r in runs:
    if (r["config"], r["leave_out"]) not in keys:
        keys.append((r["config"], r["leave_out"]))
alone = statistics.median(r["samples_per_s"] for r in runs if r["config"] == "alone")
print(f"{'config':14s} {'leave_out':9s} {'samples/s (min-max)':24s} {'/ alone':>8s} {'run s':>7s}  last split")
for config, leave in keys:
    rs = [r for r in runs if (r["config"], r["leave_out"]) == (config, leave)]
    v = [r["samples_per_s"] for r in rs]
    med = statistics.median(v)
    print(f"{config:14s} {leave:9s} {med:8.0f} ({min(v):.0f}-{max(v):.0f})      {med / alone:8.3f} "
          f"{statistics.median(r['run_s'] for r in rs):7.2f}  {rs[-1]['split']}")
PY

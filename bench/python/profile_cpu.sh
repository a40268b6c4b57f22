#!/usr/bin/env bash
# Where the CPU of a step goes: hetra.torch (bench/python/mlp_bench.py, --variant hetra) against
# `hetra run` on the same model and emulated devices. Each is profiled whole with perf (cpu-clock
# samples of every process of the job) twice, for SHORT and for LONG steps; the difference of the
# two is the CPU of LONG - SHORT steps of steady training, without start-up, data loading or
# warm-up. Prints, per run, its samples/s (the long run's) and the CPU milliseconds per 1000
# trained samples in all and in each library (OpenBLAS, libtorch, the interpreter, hetra), so that
# runs at different speeds compare per unit of work. Needs perf (Debian linux-perf), a quiet machine.
#   [SLOWDOWNS=1,2,4] [OPTIMIZER=torch|hetra] [SHORT=100] [LONG=700] bench/python/profile_cpu.sh [BUILD]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
source "$root/bench/python/runs.sh"
slowdowns=${SLOWDOWNS:-1,2,4}
optimizer=${OPTIMIZER:-torch}
short=${SHORT:-100}
long=${LONG:-700}
command -v perf >/dev/null || { echo "profile_cpu.sh: needs perf (apt-get install linux-perf)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work" "$results"' EXIT
IFS=, read -r -a factors <<<"$slowdowns"
config=$work/devices.toml
sed '/^\[\[devices\]\]/,$d' "$root/examples/fashion_mnist_hetero.toml" >"$config"
for i in "${!factors[@]}"; do
  printf '[[devices]]\nname = "d%s"\nslowdown = %s\n' "$i" "${factors[$i]}" >>"$config"
done

# recorded NAME COMMAND...: runs COMMAND under perf (children included); stdout to $work/NAME.out;
# a failed run shows its stderr.
recorded() {
  local name=$1
  shift
  perf record -q -e cpu-clock -F 500 -o "$work/$name.data" -- "$@" >"$work/$name.out" \
    2>"$work/$name.err" || { echo "profile_cpu.sh: $name failed:" >&2; cat "$work/$name.err" >&2; exit 1; }
}

hetra_torch() {
  recorded "$1" "$hetra" launch -np "${#factors[@]}" --slowdowns "$slowdowns" -- "$python" \
    "$root/bench/python/mlp_bench.py" --steps "$2" --warmup "$warmup" --variant hetra \
    --optimizer "$optimizer"
}

hetra_run() {
  recorded "$1" "$hetra" run "$config" --set train.steps=$((warmup + $2)) --set train.eval_every=0 \
    --metrics "$work/$1.jsonl"
}

# report NAME SAMPLES_PER_S: CPU ms per 1000 samples of NAME-long minus NAME-short, per library
# (each perf sample is 1/500 s of one CPU).
report() {
  for run in short long; do
    perf report -i "$work/$1-$run.data" --no-children --sort dso -q -g none -F sample,dso \
      2>/dev/null >"$work/$1-$run.dsos"
  done
  "$python" - "$work/$1-short.dsos" "$work/$1-long.dsos" <<PY
import sys
def dsos(path):
    rows = [line.split(None, 1) for line in open(path) if line.strip()]
    return {dso.strip(): int(n) for n, dso in rows}
short, long = dsos(sys.argv[1]), dsos(sys.argv[2])
per_k = 1000 / (($long - $short) * $global_batch)  # per 1000 samples
diff = {d: long[d] - short.get(d, 0) for d in long}
print(f"$1: $2 samples/s, {sum(diff.values()) * 2 * per_k:.2f} CPU ms per 1000 samples")
for dso, n in sorted(diff.items(), key=lambda kv: -kv[1]):
    if n >= sum(diff.values()) / 200:
        print(f"  {dso:40s} {n * 2 * per_k:6.2f}")
PY
}

global_batch=512  # mlp_bench.py's and the demo config's
for run in short long; do
  hetra_torch "hetra.torch-$run" "${!run}"
  hetra_run "hetra-run-$run" "${!run}"
done
report hetra.torch "$("$python" -c "import json
print(json.loads(open('$work/hetra.torch-long.out').read())['samples_per_s'])")"
report hetra-run "$("$python" -c "import json
steps = [r for r in map(json.loads, open('$work/hetra-run-long.jsonl')) if r.get('event') == 'step'][$warmup:]
print(round(sum(r['samples'] for r in steps) / sum(r['step_time_s'] for r in steps)))")"

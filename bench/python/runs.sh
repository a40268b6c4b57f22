# Shared by the Python comparisons (compare_python.sh, compare_balance_shape.sh); sourced after the
# caller sets `root` (the repository) and `build` (with tools/hetra/hetra and python/).
# Sets hetra, python, steps (STEPS, default 300), warmup and results (a temporary file, removed on
# exit), and defines the two kinds of run; each prints one JSON line (rank 0's) for the caller to tag.
hetra=$build/tools/hetra/hetra
export PYTHONPATH=$build/python:$root/python${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1
python=${PYTHON:-/usr/bin/python3}
steps=${STEPS:-300}
warmup=20
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# mlp_bench NP SLOWDOWNS [mlp_bench.py options]: the MLP script on NP emulated devices. hetra launch
# --slowdowns gives each rank its factor (HETRA_SLOWDOWNS, which the script reads) and binds the
# ranks to cores by duty cycle, as hetra run does, for every variant alike.
mlp_bench() {
  local np=$1 slowdowns=$2
  shift 2
  "$hetra" launch -np "$np" --slowdowns "$slowdowns" -- \
    "$python" "$root/bench/python/mlp_bench.py" --steps "$steps" --warmup "$warmup" "$@"
}

# hetra_run_record: hetra run on the demo cluster (slowdowns 1, 2, 4): samples/s over the same steps
# after the same warm-up, from its step records, and the last split.
hetra_run_record() {
  local metrics
  metrics=$(mktemp)
  "$hetra" run "$root/examples/fashion_mnist_hetero.toml" --set train.steps=$((warmup + steps)) \
    --set train.eval_every=0 --metrics "$metrics" >/dev/null
  "$python" -c "import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get('event') == 'step'][$warmup:]
print(json.dumps({'variant': 'hetra run', 'backend': 'hetra', 'slowdowns': '1,2,4', 'change': '',
                  'steps': len(steps), 'samples_per_s': round(sum(r['samples'] for r in steps)
                  / sum(r['step_time_s'] for r in steps), 1),
                  'split': [r['batch'] for r in steps[-1]['ranks']]}))" "$metrics"
  rm -f "$metrics"
}

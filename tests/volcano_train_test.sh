#!/usr/bin/env bash
# One rank per "pod": three processes run `hetra run CONFIG --rank-from-env` with the variables a
# Volcano job gives its pods (VC_TASK_INDEX and VC_CPU_HOSTS from the env and svc plugins;
# HETRA_VOLCANO_TASK(S), HETRA_MASTER_PORT, HETRA_JOB_ID and the 0600 secret file as the manifest of
# `hetra k8s` sets them), every host 127.0.0.1. Their losses must equal those of `hetra run` of the
# same config. The shares are equal (balance.mode=equal), so both runs add the same numbers in the
# same order; a dynamic balance would move samples between ranks by measured speed.
#   tests/volcano_train_test.sh SOURCE_DIR HETRA_BINARY
set -euo pipefail
src=$(realpath "$1")
hetra=$(realpath "$2")
skip() {
  echo "SKIP: $*"
  exit 77
}
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
  skip "dataset-fashion-mnist is not installed"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
config=$src/examples/fashion_mnist_hetero.toml
steps=30
sets=(--set train.steps=$steps --set train.warmup_steps=5 --set train.eval_every=0 --set balance.mode=equal)

# Without a launcher's variables, --rank-from-env refuses to start ranks itself.
if env -u HETRA_RANK -u VC_TASK_INDEX "$hetra" run "$config" --rank-from-env >"$work/none.log" 2>&1; then
  echo "FAIL: hetra run --rank-from-env ran without a rank in the environment"
  exit 1
fi
grep -q -- "--rank-from-env: no launcher's variables name a rank here" "$work/none.log" || {
  echo "FAIL: unexpected message:"
  cat "$work/none.log"
  exit 1
}

"$hetra" run "$config" "${sets[@]}" --metrics "$work/run.jsonl" >"$work/run.log" 2>&1 ||
  { tail -20 "$work/run.log"; exit 1; }

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$work/job-secret")
pids=()
for index in 0 1 2; do
  env VC_TASK_INDEX=$index VK_TASK_INDEX=$index VC_CPU_HOSTS=127.0.0.1,127.0.0.1,127.0.0.1 VC_CPU_NUM=3 \
    HETRA_VOLCANO_DIR="$work/no-volcano-dir" HETRA_VOLCANO_TASK=cpu HETRA_VOLCANO_TASKS=cpu \
    HETRA_MASTER_PORT=$port HETRA_JOB_ID=volcano-train HETRA_JOB_SECRET_FILE="$work/job-secret" \
    HETRA_LOG=info timeout 300 "$hetra" run "$config" "${sets[@]}" --rank-from-env \
    --metrics "$work/pods.jsonl" >"$work/pod$index.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if [[ $status -ne 0 ]]; then
  for index in 0 1 2; do echo "--- pod $index"; tail -15 "$work/pod$index.log"; done
  exit 1
fi

for index in 0 1 2; do
  grep -q "rank $index of 3 from volcano's environment, store 127.0.0.1:$port" "$work/pod$index.log" || {
    echo "FAIL: pod $index did not take rank $index from Volcano's variables:"
    tail -15 "$work/pod$index.log"
    exit 1
  }
done

/usr/bin/python3 - "$work/run.jsonl" "$work/pods.jsonl" "$steps" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("event") == "step"}
run, pods, steps = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
if len(run) < 2 or sorted(pods) != sorted(run):
    sys.exit(f"FAIL: steps recorded: hetra run {sorted(run)}, pods {sorted(pods)}")
worst = max(abs(pods[s] - run[s]) / abs(run[s]) for s in run)
print(f"{len(run)} step records: largest relative loss difference between the pods and hetra run {worst:.2e}; "
      f"last loss {run[max(run)]:.5f} vs {pods[max(run)]:.5f}")
if worst > 1e-6:
    sys.exit("FAIL: the ranks started from Volcano's variables train differently from hetra run")
PY

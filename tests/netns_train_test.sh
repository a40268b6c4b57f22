#!/usr/bin/env bash
# Two network-namespace hosts x two ranks train the Fashion-MNIST MLP with the hierarchical allreduce
# and fp8 on the link between the hosts; their losses must match a one-host, uncompressed run of the
# same config within the compression tolerance; the same job started by hetra run from a config that
# names the hosts (through mpirun) must train identically. Needs root and namespaces (exit 77:
# skipped).
#   tests/netns_train_test.sh SOURCE_DIR HETRA_BINARY
set -euo pipefail
src=$(realpath "$1")
hetra=$(realpath "$2")
cluster="$src/scripts/netns-cluster.sh"
skip() {
  echo "SKIP: $*"
  exit 77
}
# The same conditions as tests/netns_test.sh.
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
for tool in ip tc unshare nsenter; do
  command -v "$tool" >/dev/null || skip "$tool is missing (scripts/install-deps.sh installs iproute2)"
done
unshare --net --uts --ipc --mount true 2>/dev/null || skip "cannot create namespaces here"
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
  skip "dataset-fashion-mnist is not installed"
work=$(mktemp -d)
export HETRA_NETNS_STATE=$work/state
cleanup() {
  [[ -n ${KEEP:-} ]] && cp -r "$work" /tmp/netns-train-keep
  "$cluster" down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$cluster" up 2 1gbit >/dev/null
a=$("$cluster" addr h0)
b=$("$cluster" addr h1)

steps=40
cat >"$work/run.toml" <<TOML
[model]
name = "mlp"
hidden = [512, 512]
[data]
name = "fashion-mnist"
[train]
global_batch = 512
steps = $steps
optimizer = "sgd"
lr = 0.08
momentum = 0.9
seed = 3
eval_every = 0
log_every = 10
[balance]
mode = "equal"
[comm]
compression = "fp8-e4m3"
[[devices]]
[[devices]]
[[devices]]
[[devices]]
TOML

# The one-host reference: the same config, four local ranks, no compression.
"$hetra" run "$work/run.toml" --set 'comm.compression="none"' --metrics "$work/one-host.jsonl" \
  >"$work/one-host.log" 2>&1 || { tail -20 "$work/one-host.log"; exit 1; }

# Two hosts: ranks 0, 1 on h0 and 2, 3 on h1, started as a launcher would (environment variables).
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
pids=()
for r in 0 1 2 3; do
  host=h0 addr=$a
  ((r >= 2)) && host=h1 addr=$b
  "$cluster" exec $host env HETRA_RANK=$r HETRA_WORLD_SIZE=4 HETRA_LOCAL_RANK=$((r % 2)) \
    HETRA_STORE="$a:29777" HETRA_IFACE_ADDR=$addr HETRA_JOB_SECRET=$secret HETRA_LOG=info \
    "$hetra" run "$work/run.toml" --metrics "$work/two-hosts.jsonl" >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if [[ $status -ne 0 ]]; then
  for r in 0 1 2 3; do echo "--- rank $r"; tail -15 "$work/rank$r.log"; done
  exit 1
fi
grep -q "hierarchy: 2 islands (largest 2 ranks)" "$work/rank0.log" &&
  grep -q "on provider hierarchical, wire format fp8-e4m3" "$work/rank0.log" || {
  echo "FAIL: the two-host run did not use the hierarchy with fp8 between the hosts"
  grep -i hierarch "$work"/rank*.log || true
  exit 1
}

# The same two-host job started by hetra run itself from a config that names the hosts (through
# mpirun, whose remote agent enters the namespace hosts): the same ranks on the same hosts, so the
# same losses as the job started by hand.
if command -v mpirun >/dev/null; then
  sed '/^\[\[devices\]\]/,$d' "$work/run.toml" >"$work/hosts.toml"
  cat >>"$work/hosts.toml" <<TOML
[launch]
mpi_args = ["--allow-run-as-root", "--mca", "plm_rsh_agent", "$cluster rsh"]
[[devices]]
host = "$a"
[[devices]]
host = "$a"
[[devices]]
host = "$b"
[[devices]]
host = "$b"
TOML
  HETRA_JOB_SECRET=$secret timeout 240 "$hetra" run "$work/hosts.toml" \
    --metrics "$work/hosts.jsonl" >"$work/hosts.log" 2>&1 || { tail -30 "$work/hosts.log"; exit 1; }
  python3 - "$work/two-hosts.jsonl" "$work/hosts.jsonl" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("event") == "step"}
by_hand, by_run = losses(sys.argv[1]), losses(sys.argv[2])
assert by_hand.keys() == by_run.keys(), (len(by_hand), len(by_run))
worst = max(abs(by_run[s] - by_hand[s]) / by_hand[s] for s in by_hand)
print(f"hetra run with hosts (through mpirun): {len(by_run)} steps, largest relative difference "
      f"from the job started by hand {worst:.2e}")
if worst > 1e-6:
    sys.exit("FAIL: the same job started by hetra run trains differently")
PY
else
  echo "note: mpirun is not installed; hetra run with hosts not checked"
fi

python3 - "$work/one-host.jsonl" "$work/two-hosts.jsonl" "$steps" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("event") == "step"}
one, two, steps = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
assert len(one) == steps and len(two) == steps, (len(one), len(two))
worst = max(abs(two[s] - one[s]) / one[s] for s in one)
early = max(abs(two[s] - one[s]) / one[s] for s in one if s <= 10)
sent = [rank["bytes_sent"] for r in map(json.loads, open(sys.argv[2])) if r.get("event") == "step"
        for rank in r["ranks"]]
print(f"{steps} steps: relative loss difference at most {early:.5f} in steps 1-10, {worst:.4f} in all; "
      f"last loss {one[steps]:.4f} (one host) vs {two[steps]:.4f}; "
      f"mean bytes sent per rank per step {sum(sent) / len(sent):.0f}")
# fp8-e4m3 rounds each gradient element by at most 2^-4 of its block's scale. Over the first steps
# that moves the loss by well under 0.1% (measured: below 0.0005); later the training's own
# sensitivity amplifies any difference (0.02 at the loss spike near step 16, then below 0.012). A run
# whose gradients were wrong (an island's shards lost or counted twice) is off by more from step 2.
if early > 1e-3 or worst > 0.05:
    sys.exit(f"FAIL: the losses differ by {early:.5f} (steps 1-10, allowed 0.001) and {worst:.4f} "
             "(all steps, allowed 0.05) relative")
PY
echo "netns training: OK"

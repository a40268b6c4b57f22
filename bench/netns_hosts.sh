# Sourced by the benchmarks that run across two network-namespace "hosts" (scripts/netns-cluster.sh;
# needs root): brings the cluster up with its link rate, takes it down on exit, and starts one job's
# ranks on the hosts as a launcher would (environment variables).
#   source bench/netns_hosts.sh; hosts_up RATE     then $A, $B are the addresses of h0 and h1
CLUSTER=scripts/netns-cluster.sh

hosts_up() {
  trap '$CLUSTER down >/dev/null 2>&1 || true' EXIT
  $CLUSTER down >/dev/null 2>&1 || true
  $CLUSTER up 2 "$1" >/dev/null
  A=$($CLUSTER addr h0)
  B=$($CLUSTER addr h1)
  port=29600
}

# Payload leaving host h0 through its veth, TCP/IP headers included. /proc/net/dev is per network
# namespace (sysfs would show the mounting namespace's devices).
tx_bytes() { $CLUSTER exec h0 awk '$1 == "eth0:" { print $10 }' /proc/net/dev; }

# run_ranks LOG_PREFIX RANKS RANKS_ON_H0 ENV... -- COMMAND...: one job of RANKS ranks, ranks
# 0..RANKS_ON_H0-1 on h0 and the rest on h1, each rank's output in LOG_PREFIX.rR.log. Returns
# non-zero (after the tail of every log) when a rank failed.
run_ranks() {
  local prefix=$1 n=$2 first=$3
  shift 3
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  port=$((port + 1))
  local pids=() r host addr status=0
  for ((r = 0; r < n; r++)); do
    host=h0 addr=$A
    ((r >= first)) && host=h1 addr=$B
    $CLUSTER exec $host env HETRA_RANK=$r HETRA_WORLD_SIZE=$n \
      HETRA_LOCAL_RANK=$((r < first ? r : r - first)) HETRA_STORE=$A:$port HETRA_IFACE_ADDR=$addr \
      "${envs[@]}" "$@" >"$prefix.r$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  if [[ $status -ne 0 ]]; then
    echo "$prefix failed:"
    tail -n 5 "$prefix".r*.log
  fi
  return $status
}

#!/usr/bin/env bash
# A test cluster on one machine: N "hosts", each a set of namespaces (network, hostname, IPC and
# mount with its own /dev/shm and /etc/hosts) held by one long-lived process, joined through veth
# links to a bridge, each link limited by tc tbf. Ranks started on one host share its namespaces,
# so hetra's host identity (hostname + boot id + IPC namespace) and shared memory behave as on
# separate machines, and tcp traffic between hosts crosses a rate-limited link. Needs root.
#
#   scripts/netns-cluster.sh up N [RATE]     N hosts h0..h(N-1), links of RATE (tc units, default 1gbit)
#   scripts/netns-cluster.sh down            removes everything, also after a crash (idempotent)
#   scripts/netns-cluster.sh exec HOST CMD...  runs CMD on HOST (h0, 0 or hetra-h0), in its namespaces
#   scripts/netns-cluster.sh rsh HOST WORDS...  runs the shell command WORDS on HOST, as ssh does:
#                                           mpirun's remote agent (--mca plm_rsh_agent "THIS rsh");
#                                           HOST may also be a host's address or hostname
#   scripts/netns-cluster.sh addr HOST       prints HOST's address
#   scripts/netns-cluster.sh list            one line per host: name hostname address holder-pid
#
# Addresses are 198.18.0.1... (198.18.0.0/15 is reserved for network benchmarks, RFC 2544); the
# bridge, in the calling namespace, is 198.18.0.254, so a launcher outside the hosts reaches them.
# Inside every host, /etc/hosts names all of them (hetra-h0 ...). State: $HETRA_NETNS_STATE
# (default /run/hetra-netns).
set -euo pipefail

STATE=${HETRA_NETNS_STATE:-/run/hetra-netns}
BRIDGE=hnc-br
LINK_PREFIX=hnc-           # hnc-hI on the bridge; its peer is eth0 inside host I
HOLDER_TAG=hetra-netns-    # argv[0] of the holders: hetra-netns-hI (found again after a crash)
SUBNET=198.18.0
BRIDGE_ADDR=$SUBNET.254

die() {
  echo "netns-cluster: $*" >&2
  exit 1
}

need_tools() {
  [[ $(id -u) -eq 0 ]] || die "needs root (namespaces, links and qdiscs)"
  local tool
  for tool in ip tc unshare nsenter; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian packages iproute2, util-linux)"
  done
}

# Bits per second of a tc rate: 200mbit, 1gbit, 500kbit, 1000000bit.
rate_bits() {
  local rate=${1,,} number unit
  [[ $rate =~ ^([0-9]+)([kmg]?bit)$ ]] || die "rate '$1' is not N[k|m|g]bit"
  number=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in
    bit) echo "$number" ;;
    kbit) echo $((number * 1000)) ;;
    mbit) echo $((number * 1000000)) ;;
    gbit) echo $((number * 1000000000)) ;;
  esac
}

holder_pid() { # name -> pid of its holder (from the state)
  local name=$1
  [[ -f $STATE/$name.pid ]] || die "no host '$name' (is the cluster up? see: $0 list)"
  cat "$STATE/$name.pid"
}

host_name() { # h0 | 0 | hetra-h0 | 198.18.0.1 -> h0
  local host=$1
  if [[ $host == "$SUBNET".* ]]; then
    local last=${host##*.}
    [[ $last =~ ^[0-9]+$ ]] && host=$((last - 1))
  fi
  host=${host#hetra-}
  [[ $host =~ ^[0-9]+$ ]] && host=h$host
  echo "$host"
}

is_holder() { # pid -> true when it is one of our holders
  local cmdline
  cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == "$HOLDER_TAG"* ]]
}

# Every process that lives in the network namespace of holder `pid` (the holder included).
members_of() {
  local ns proc
  ns=$(readlink "/proc/$1/ns/net" 2>/dev/null) || return 0
  [[ $ns != "$(readlink /proc/self/ns/net)" ]] || return 0 # never the machine's own namespace
  for proc in /proc/[0-9]*; do
    [[ $(readlink "$proc/ns/net" 2>/dev/null) == "$ns" ]] && echo "${proc#/proc/}"
  done
  return 0
}

cmd_down() {
  need_tools
  local pids=() pid file proc
  # Holders named in the state, and any left by an `up` that died before writing it.
  if [[ -d $STATE ]]; then
    for file in "$STATE"/*.pid; do
      [[ -f $file ]] || continue
      pid=$(cat "$file")
      is_holder "$pid" && pids+=("$pid")
    done
  fi
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    is_holder "$pid" && pids+=("$pid")
  done
  # Everything still running inside a host goes with it, so that its namespaces are freed.
  local victims=()
  for pid in "${pids[@]}"; do
    mapfile -t -O "${#victims[@]}" victims < <(members_of "$pid")
  done
  if ((${#victims[@]})); then kill -KILL "${victims[@]}" 2>/dev/null || true; fi
  for pid in "${victims[@]}"; do
    for _ in $(seq 100); do
      [[ -e /proc/$pid ]] || break
      sleep 0.05
    done
  done
  # Links die with their namespace; the ends on the bridge side may take a moment.
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$LINK_PREFIX" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  rm -rf "$STATE"
}

cmd_up() {
  need_tools
  local n=${1:-}
  local rate=${2:-1gbit}
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then die "up N: N must be 1 to 200, got '$n'"; fi
  local bits burst
  bits=$(rate_bits "$rate")
  # The bucket holds 10 ms at the rate, at least 128 KiB: a veth hands tbf whole 64 KiB GSO
  # packets, which a smaller bucket could never pass.
  burst=$((bits / 8 / 100))
  ((burst < 131072)) && burst=131072
  if [[ -d $STATE ]] || ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "a cluster is already up (or left over): run '$0 down' first"
  fi
  mkdir -p "$STATE"
  UP_DONE=0
  trap '[[ $UP_DONE == 1 ]] || { echo "netns-cluster: up failed; cleaning up" >&2; cmd_down; }' EXIT
  echo "$rate" >"$STATE/rate"

  ip link add "$BRIDGE" type bridge
  ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up

  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < n; i++)); do echo "$SUBNET.$((i + 1)) hetra-h$i"; done
  } >"$STATE/hosts"

  local i name pid addr
  for ((i = 0; i < n; i++)); do
    name=h$i
    addr=$SUBNET.$((i + 1))
    # The holder: its own network, hostname, IPC and mount namespaces, alive until `down`.
    setsid unshare --net --uts --ipc --mount --propagation private \
      bash -c "echo \$\$ >'$STATE/$name.pid.new'; exec -a '$HOLDER_TAG$name' sleep infinity" \
      </dev/null >/dev/null 2>&1 &
    for _ in $(seq 200); do
      [[ -s $STATE/$name.pid.new ]] && break
      sleep 0.01
    done
    [[ -s $STATE/$name.pid.new ]] || die "the holder of $name did not start"
    pid=$(cat "$STATE/$name.pid.new")
    for _ in $(seq 200); do
      is_holder "$pid" && break
      sleep 0.01
    done
    is_holder "$pid" || die "the holder of $name did not start"
    mv "$STATE/$name.pid.new" "$STATE/$name.pid"

    nsenter -t "$pid" -u hostname "hetra-$name"
    nsenter -t "$pid" -m sh -c "mount -t tmpfs -o mode=1777 hetra-shm /dev/shm && mount --bind '$STATE/hosts' /etc/hosts"

    ip link add "$LINK_PREFIX$name" type veth peer name "${LINK_PREFIX}p$i"
    ip link set "${LINK_PREFIX}p$i" netns "$pid"
    ip link set "$LINK_PREFIX$name" master "$BRIDGE" up
    nsenter -t "$pid" -n sh -c "ip link set lo up && ip link set '${LINK_PREFIX}p$i' name eth0 &&
      ip addr add '$addr/24' dev eth0 && ip link set eth0 up"
    # Both directions of the host's link: toward the host on the bridge side, from it inside.
    tc qdisc add dev "$LINK_PREFIX$name" root tbf rate "$rate" burst "$burst" latency 50ms
    nsenter -t "$pid" -n tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    echo "$addr" >"$STATE/$name.addr"
  done
  UP_DONE=1
  echo "netns-cluster: $n hosts up, links of $rate (bridge $BRIDGE $BRIDGE_ADDR)"
}

cmd_exec() {
  need_tools
  [[ $# -ge 2 ]] || die "exec HOST CMD..."
  local name pid
  name=$(host_name "$1")
  shift
  pid=$(holder_pid "$name")
  is_holder "$pid" || die "the holder of $name (pid $pid) is gone: run '$0 down'"
  exec nsenter -t "$pid" -n -u -i -m --wd="$PWD" -- "$@"
}

# ssh's contract: the words after the host are joined and run by a shell on that host.
cmd_rsh() {
  [[ $# -ge 2 ]] || die "rsh HOST WORDS..."
  local host=$1
  shift
  cmd_exec "$host" sh -c "$*"
}

cmd_addr() {
  local name
  name=$(host_name "${1:-}")
  [[ -f $STATE/$name.addr ]] || die "no host '$name'"
  cat "$STATE/$name.addr"
}

cmd_list() {
  local file name
  [[ -d $STATE ]] || return 0
  for file in "$STATE"/h*.pid; do
    [[ -f $file ]] || continue
    name=$(basename "$file" .pid)
    echo "$name hetra-$name $(cat "$STATE/$name.addr" 2>/dev/null || echo -) $(cat "$file")"
  done
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  rsh) shift; cmd_rsh "$@" ;;
  addr) shift; cmd_addr "$@" ;;
  list) cmd_list ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

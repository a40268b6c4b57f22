#!/usr/bin/env bash
# The test cluster of scripts/netns-cluster.sh: two hosts on 200mbit links. Checks that each host
# has its own hostname, IPC namespace and /dev/shm, that one reaches the other over TCP, that the
# links carry about their rate (a raw TCP stream and hetra bench's tcp allreduce, one rank per
# host), and that `down` leaves nothing behind.
#   tests/netns_test.sh SOURCE_DIR HETRA_BINARY
# Exits 77 (skipped) without root or where namespaces cannot be made.
set -euo pipefail

SRC=${1:?source dir}
HETRA=${2:?hetra binary}
CLUSTER="$SRC/scripts/netns-cluster.sh"
RATE_MBIT=200
STATE=${HETRA_NETNS_STATE:-/run/hetra-netns}
export HETRA_NETNS_STATE=$STATE

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
for tool in ip tc unshare nsenter perl; do
  command -v "$tool" >/dev/null || skip "$tool is missing (scripts/install-deps.sh installs iproute2)"
done
unshare --net --uts --ipc --mount true 2>/dev/null || skip "cannot create namespaces here"
[[ -d $STATE ]] && fail "a cluster is already up at $STATE (run: $CLUSTER down)"

WORK=$(mktemp -d)
cleanup() {
  "$CLUSTER" down || true
  rm -rf "$WORK"
}
trap cleanup EXIT

on() { "$CLUSTER" exec "$@"; }

"$CLUSTER" up 2 "${RATE_MBIT}mbit"
A=$("$CLUSTER" addr h0)
B=$("$CLUSTER" addr h1)

# Own hostnames and IPC namespaces, and the host identity hetra derives from them.
[[ $(on h0 hostname) == hetra-h0 ]] || fail "h0's hostname is $(on h0 hostname)"
[[ $(on h1 hostname) == hetra-h1 ]] || fail "h1's hostname is $(on h1 hostname)"
ipc0=$(on h0 readlink /proc/self/ns/ipc)
ipc1=$(on h1 readlink /proc/self/ns/ipc)
[[ $ipc0 != "$ipc1" && $ipc0 != $(readlink /proc/self/ns/ipc) ]] || fail "IPC namespaces are shared"
[[ $(on h0 readlink /proc/self/ns/ipc) == "$ipc0" ]] || fail "two commands on h0 differ in IPC ns"

# Own /dev/shm: a segment made on h0 is seen by h0 only.
probe=hetra-netns-probe-$$
on h0 sh -c "echo from-h0 > /dev/shm/$probe"
[[ $(on h0 cat /dev/shm/$probe) == from-h0 ]] || fail "h0 does not see its own /dev/shm file"
on h1 test ! -e "/dev/shm/$probe" || fail "h1 sees h0's /dev/shm"
[[ ! -e /dev/shm/$probe ]] || fail "the machine's /dev/shm sees h0's file"
[[ $(on h0 getent hosts hetra-h1 | awk '{print $1}') == "$B" ]] || fail "h0 cannot resolve hetra-h1"
echo "ok: hostnames hetra-h0/hetra-h1, IPC $ipc0 / $ipc1, private /dev/shm, /etc/hosts"

# TCP from h0 to h1: a line, then a timed 40 MB stream (the receiver times it from the first byte).
# shellcheck disable=SC2016 # perl's variables, not the shell's
on h1 timeout 60 perl -MIO::Socket::INET -MTime::HiRes=time -e '
  my $s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => 5555, Listen => 1,
                                ReuseAddr => 1) or die "listen: $!";
  my $c = $s->accept; my $line = <$c>; print STDOUT $line; close $c;
  $c = $s->accept; my ($n, $buf, $t0) = (0, "", 0);
  while (my $r = sysread($c, $buf, 1 << 20)) { $t0 ||= time; $n += $r }
  printf STDOUT "bytes %d seconds %.4f\n", $n, time - $t0;' "$B" >"$WORK/recv.txt" &
receiver=$!
sent=0
for _ in $(seq 100); do
  if on h0 bash -c "echo hello-from-h0 > /dev/tcp/$B/5555" 2>/dev/null; then
    sent=1
    break
  fi
  sleep 0.05
done
((sent)) || fail "h0 cannot connect to $B:5555"
sleep 0.2
on h0 bash -c "head -c 40000000 /dev/zero > /dev/tcp/$B/5555"
wait "$receiver" || fail "the receiver on h1 failed"
grep -q '^hello-from-h0$' "$WORK/recv.txt" || fail "h1 did not receive the line: $(cat "$WORK/recv.txt")"
read -r _ bytes _ seconds < <(grep '^bytes' "$WORK/recv.txt")
[[ $bytes == 40000000 ]] || fail "h1 received $bytes bytes of 40000000"
tcp_mbit=$(awk -v b="$bytes" -v s="$seconds" 'BEGIN { printf "%.1f", b * 8 / s / 1e6 }')
echo "ok: h0 -> h1 over TCP; a 40 MB stream at $tcp_mbit Mbit/s (link ${RATE_MBIT}mbit)"

# hetra bench, one rank per host, the rank environment set by hand: rank 0 serves the store on h0,
# each rank's tcp transport listens on its host's address. 2-rank allreduce: busbw = bytes each
# rank sends per second on its link.
common=(bench allreduce --transport tcp -b 4M -e 4M -w 1 -n 5 -c 1 --timeout-ms 60000)
on h1 env HETRA_RANK=1 HETRA_WORLD_SIZE=2 HETRA_STORE="$A:29555" HETRA_IFACE_ADDR="$B" \
  "$HETRA" "${common[@]}" >"$WORK/rank1.txt" 2>&1 &
rank1=$!
on h0 env HETRA_RANK=0 HETRA_WORLD_SIZE=2 HETRA_STORE="$A:29555" HETRA_IFACE_ADDR="$A" \
  "$HETRA" "${common[@]}" --json "$WORK/bench.json" >"$WORK/rank0.txt" 2>&1 ||
  fail "rank 0 failed: $(cat "$WORK/rank0.txt")"
wait "$rank1" || fail "rank 1 failed: $(cat "$WORK/rank1.txt")"
cat "$WORK/rank0.txt"
grep -q "2 ranks, transport tcp" "$WORK/rank0.txt" || fail "not a 2-rank tcp run"
grep -q "Out of bounds values : 0 OK" "$WORK/rank0.txt" || fail "wrong allreduce results"
bench_mbit=$(perl -ne 'print sprintf("%.1f", $1 * 8000) if /"busbw_gbs":\s*([0-9.eE+-]+)/' "$WORK/bench.json")
[[ -n $bench_mbit ]] || fail "no busbw in $(cat "$WORK/bench.json")"
echo "ok: hetra bench allreduce h0 <-> h1: busbw $bench_mbit Mbit/s (link ${RATE_MBIT}mbit)"

# The limit holds (an unlimited veth carries several Gbit/s) and the link is usable (at least half).
for measured in "$tcp_mbit" "$bench_mbit"; do
  awk -v m="$measured" -v r="$RATE_MBIT" 'BEGIN { exit !(m <= r * 1.1 && m >= r * 0.5) }' ||
    fail "measured $measured Mbit/s on a ${RATE_MBIT}mbit link"
done

# hetra launch with hosts: mpirun starts one rank per host through the cluster's rsh agent; the
# ranks read OMPI_COMM_WORLD_* and the store this launcher serves (reached through the bridge).
# Each rank listens on its own host's address (hostname -i: /etc/hosts of its host).
if command -v mpirun >/dev/null; then
  "$HETRA" launch -H "$A:1,$B:1" --mpi-arg=--allow-run-as-root --mpi-arg=--mca \
    --mpi-arg=plm_rsh_agent --mpi-arg="$CLUSTER rsh" -- sh -c \
    "echo on \$(hostname) rank \$OMPI_COMM_WORLD_RANK; HETRA_IFACE_ADDR=\$(hostname -i) exec $HETRA \
      bench allreduce --transport tcp -b 1M -e 1M -w 1 -n 3 -c 1" >"$WORK/mpirun.txt" 2>&1 ||
    fail "hetra launch over mpirun failed: $(cat "$WORK/mpirun.txt")"
  cat "$WORK/mpirun.txt"
  grep -q "on hetra-h0 rank 0" "$WORK/mpirun.txt" || fail "rank 0 did not run on hetra-h0"
  grep -q "on hetra-h1 rank 1" "$WORK/mpirun.txt" || fail "rank 1 did not run on hetra-h1"
  grep -q "Out of bounds values : 0 OK" "$WORK/mpirun.txt" || fail "wrong results under mpirun"
  echo "ok: hetra launch -H $A:1,$B:1 ran hetra bench through mpirun, one rank per host"
else
  echo "note: mpirun is not installed (scripts/install-deps.sh bench): hetra launch -H not run"
fi

# down leaves nothing: no state, no holders, no links, no processes in the hosts' namespaces.
"$CLUSTER" down
trap 'rm -rf "$WORK"' EXIT
[[ ! -e $STATE ]] || fail "$STATE is left"
for proc in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
  [[ $cmd == hetra-netns-* ]] && fail "holder ${proc#/proc/} is left: $cmd"
done
if ip -o link show | awk -F': ' '{print $2}' | grep -q '^hnc-'; then
  fail "links are left: $(ip -o link show | grep hnc-)"
fi
"$CLUSTER" down || fail "a second down failed"
echo "ok: down removed the hosts, their holders, links and bridge"

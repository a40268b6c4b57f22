#!/usr/bin/env bash
# Allreduce across two network-namespace "hosts" joined by a rate-limited link
# (scripts/netns-cluster.sh; needs root): flat ring vs hierarchical vs hierarchical with fp8 on the
# link, 2 hosts x 2 ranks, and a flat 1 + 1 ranks fp32 vs fp8. Prints hetra bench's rows and the
# link's measured rate (bytes leaving host h0 through its veth, TCP/IP headers included).
#   bench/compare_multihost.sh [RATE] [SIZE]     (defaults: 1gbit, 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
SIZE=${2:-64M}
HETRA=$(realpath "${HETRA:-build/tools/hetra/hetra}")
OUT=${OUT:-bench/out/multihost}
mkdir -p "$OUT"
source bench/netns_hosts.sh
hosts_up "$RATE"

# run NAME RANKS_PER_HOST ENV... -- BENCH_ARGS...: one job, ranks 0..k-1 on h0, the rest on h1.
run() {
  local name=$1 per=$2
  shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local before after
  before=$(tx_bytes)
  run_ranks "$OUT/$name" $((2 * per)) "$per" "${envs[@]}" -- \
    "$HETRA" bench allreduce -b "$SIZE" -e "$SIZE" -w 1 -n 5 --json "$OUT/$name.json" "$@" ||
    return 1
  after=$(tx_bytes)
  python3 - "$name" "$OUT/$name.json" "$before" "$after" "$RATE" <<'PY'
import json, re, sys
name, path, before, after, rate = sys.argv[1:]
row = json.load(open(path))[0]
bits = {"k": 1e3, "m": 1e6, "g": 1e9, "": 1}[re.match(r"\d+([kmg]?)bit", rate).group(1)]
link = float(re.match(r"(\d+)", rate).group(1)) * bits / 8
# 1 checked + 1 warm-up + 5 timed operations crossed the link; the rate is taken over the timed
# median (bytes of one operation / its time).
per_op = (int(after) - int(before)) / 7
seconds = row["time_us"] / 1e6
print(f"{name:28s} time {seconds*1e3:9.1f} ms  algbw {row['algbw_gbs']:.3f} GB/s  "
      f"link {per_op/seconds/1e6:7.1f} MB/s ({per_op/seconds/link:.2f} of {rate})  wrong {row['wrong']}")
PY
}

echo "# $(date -u +%F' '%H:%M) UTC, $RATE between 2 namespace hosts, $SIZE float32 allreduce"
run flat-2x2-fp32 2 HETRA_ALGO=ring -- --transport tcp
run hier-2x2-fp32 2 HETRA_ALGO=hierarchical --
run hier-2x2-fp8 2 HETRA_ALGO=hierarchical -- --compression fp8-e4m3
run flat-1x1-fp32 1 HETRA_ALGO=ring -- --transport tcp
run flat-1x1-fp8 1 HETRA_ALGO=ring -- --transport tcp --compression fp8-e4m3

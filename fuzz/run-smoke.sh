#!/usr/bin/env bash
# Runs every fuzz target of a HETRA_FUZZ build for SECONDS each, starting from fuzz/corpus/NAME
# (left unchanged: new inputs go to a temporary corpus). Fails on the first target that finds a
# crash, a sanitizer report, an uncaught exception, a timeout (-timeout) or runs out of memory; the
# input that did it is kept in ARTIFACTS (default $TMPDIR/hetra-fuzz-artifacts) and the log is printed.
#   fuzz/run-smoke.sh build-fuzz 20
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build=$1
seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
artifacts=${ARTIFACTS:-${TMPDIR:-/tmp}/hetra-fuzz-artifacts}
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(fuzz_config fuzz_slowdown_schedule fuzz_parse_bytes fuzz_host_port fuzz_op_header
           fuzz_store_frames fuzz_tcp_frame fuzz_auth_handshake)
fi
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
ran=0
for target in "${targets[@]}"; do
  binary="$build/fuzz/$target"
  if [[ ! -x $binary ]]; then
    echo "$target: not built ($binary); build with: cmake --build $build --target fuzzers" >&2
    exit 2
  fi
  ran=$((ran + 1))
  mkdir -p "$work/$target"
  log="$work/$target.log"
  echo "== $target for ${seconds}s"
  # -timeout: one input taking longer is a hang; -rss_limit_mb: unbounded memory is a failure too.
  corpus=("$work/$target")
  [[ -d $here/corpus/$target ]] && corpus+=("$here/corpus/$target")
  if HETRA_LOG=error "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$target-" "${corpus[@]}" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done ' "$log" | tr '\n' ' '
    echo
  else
    echo "$target FAILED; log:" >&2
    tail -n 60 "$log" >&2
    failed+=("$target")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "failed: ${failed[*]} (inputs in $artifacts)" >&2
  exit 1
fi
echo "$ran fuzz targets ran ${seconds}s each without a failure"

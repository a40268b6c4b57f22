#!/usr/bin/env bash
# Prints one closing line for all of `make test`: every ctest run writes a JUnit file
# (ctest --output-junit), and this adds them up, so the suite ends on the count of what it ran
# rather than on whichever ctest run happened to be last (a GPU-less CUDA run skips all its tests).
#   scripts/test-summary.sh build/ctest-junit.xml build-asan/ctest-junit.xml ...
set -euo pipefail
passed=0 failed=0 skipped=0
for report in "$@"; do
  [[ -f $report ]] || continue
  # The <testsuite> element carries the counts: tests, failures, disabled (not run), skipped.
  line=$(head -n 20 "$report" | tr '\n\t' '  ' | grep -o '<testsuite [^>]*>' | head -1)
  count() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$line"; }
  tests=$(count tests) failures=$(count failures) skips=$(count skipped) disabled=$(count disabled)
  skips=$((${skips:-0} + ${disabled:-0}))
  failed=$((failed + ${failures:-0}))
  skipped=$((skipped + skips))
  passed=$((passed + ${tests:-0} - ${failures:-0} - skips))
done
echo "total: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]

#!/bin/bash
# The progress bar of `hetra run` as a person sees it: run in a tmux pane, the pane shows one bar
# (steps, epoch, samples/s, ETA, split) redrawn in place, during the run and at its end; through a
# pipe the same run prints plain step lines and no bar.
# Usage: progress_test.sh HETRA_BINARY SOURCE_DIR. Exit 77 (skipped) when tmux is missing.
set -u
hetra=$1
config=$2/examples/tiny_synthetic.toml
command -v tmux >/dev/null || { echo "tmux is missing (Debian package tmux): skipped"; exit 77; }
socket=hetra-progress-$$
work=$(mktemp -d)
trap 'tmux -L "$socket" kill-server 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- pane:"; cat "$work/pane" 2>/dev/null; exit 1; }

# Long enough to be seen mid-run on a fast machine: the equal split keeps the slow devices in every
# step (the balancer alone gives this tiny model's whole batch to the fastest device, and then 2000
# steps end within two seconds).
steps=8000
bar="^\[[#.]+\] [0-9]+/$steps epoch [0-9.]+ loss [0-9.]+ [0-9]+ samples/s eta ([0-9]+:)?[0-9]+:[0-9]{2} split [0-9]+/[0-9]+/[0-9]+"
tmux -L "$socket" new-session -d -x 160 -y 40 \
  "$hetra run $config --set train.steps=$steps --set train.eval_every=0 --set 'balance.mode=\"equal\"'; echo EXIT=\$?; sleep 600"
pane() { tmux -L "$socket" capture-pane -p > "$work/pane"; }

# During the run: one bar, short of the end.
seen=""
for _ in $(seq 1 1200); do
  pane
  if grep -Eq "$bar" "$work/pane" && ! grep -q "$steps/$steps" "$work/pane"; then seen=1; break; fi
  grep -q "EXIT=" "$work/pane" && break
  sleep 0.1
done
[ -n "$seen" ] || fail "no progress bar while the run ran"
[ "$(grep -Ec "$bar" "$work/pane")" = 1 ] || fail "more than one bar line during the run"
mid=$(grep -Eo "[0-9]+/$steps" "$work/pane" | head -1)
echo "during the run: $(grep -E "$bar" "$work/pane")"

# At the end: the same single line, now full, and a zero exit status.
for _ in $(seq 1 3000); do
  pane
  grep -q "EXIT=" "$work/pane" && break
  sleep 0.1
done
grep -q "EXIT=0" "$work/pane" || fail "the run did not end with status 0"
[ "$(grep -Ec "$bar" "$work/pane")" = 1 ] || fail "the bar was not redrawn in place"
grep -Eq "^\[#+\] $steps/$steps epoch" "$work/pane" || fail "the bar did not reach $steps/$steps"
[ "${mid%/*}" -lt "$steps" ] || fail "the bar seen mid-run was already full"
echo "at the end: $(grep -E "$bar" "$work/pane")"

# Through a pipe: plain lines, no bar, no carriage return.
"$hetra" run "$config" --set train.steps=30 --set train.eval_every=0 | cat > "$work/piped" \
  || fail "the piped run failed"
grep -Eq "^step 30/30  epoch [0-9.]+  loss" "$work/piped" || { cat "$work/piped"; fail "no plain step lines"; }
if grep -q $'\r' "$work/piped" || grep -Eq '^\[[#.]+\]' "$work/piped"; then
  cat -A "$work/piped"; fail "a progress bar went into the pipe"
fi
echo "piped: $(grep -c '^step ' "$work/piped") plain step lines"
echo "ok"

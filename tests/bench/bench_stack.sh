#!/usr/bin/env bash
# Warm `stack up` time per service and idle resident memory of each service.
#   tests/bench/bench_stack.sh            (restarts the stack of $WALBRIDGE_HOME; run it when nothing else uses it)
# Budgets (issue 2): warm up < 60 s; idle RSS of the three services together < 3 GiB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STACK="$ROOT/deploy/local/stack"
HOME_DIR="${WALBRIDGE_HOME:-$ROOT/.walbridge}"
"$STACK" up >/dev/null 2>&1   # installs and initialises on the first run, so the next `up` is a warm one
"$STACK" down 2>/dev/null
start=$(date +%s.%N)
"$STACK" up 2>&1 | sed -n 's/^stack: \(.*\) is up (pid [0-9]*, \([0-9]*\)s)$/warm_up_seconds{service="\1"} \2/p'
echo "warm_up_seconds_total $(echo "$(date +%s.%N) - $start" | bc)"
sleep "${IDLE_SETTLE_SECONDS:-30}"
total=0
for s in postgres kafka registry; do
  pid=$(cat "$HOME_DIR/run/$s.pid")
  # PostgreSQL is a process tree (postmaster + background workers); shared memory is counted once per process, an upper bound.
  rss=$(ps -o rss= -p "$pid" --ppid "$pid" | awk '{t += $1} END {print t}')
  total=$((total + rss))
  echo "idle_rss_mib{service=\"$s\"} $((rss / 1024))"
done
echo "idle_rss_mib_total $((total / 1024)) (budget 3072)"

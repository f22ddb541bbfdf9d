#!/usr/bin/env bash
# The whole suite, race-built, RUNS times in a row (default 5) beside two CPU
# burners: the tests' deadlines must hold on a loaded machine. Stops at the
# first failure and prints its failing tests; logs stay in a temporary
# directory, which it names.
#
#   scripts/stress-suite.sh            # five runs
#   RUNS=2 scripts/stress-suite.sh
set -u
exec </dev/null
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
logs=$(mktemp -d)
burn() { while :; do :; done; }
burn &
b1=$!
burn &
b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
echo "logs in $logs"
for i in $(seq 1 "$runs"); do
	start=$(date +%s)
	echo "== run $i start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
	if go test -race -count=1 -timeout 25m ./... >"$logs/run$i.log" 2>&1; then
		echo "== run $i ok in $(($(date +%s) - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
	else
		echo "== run $i FAILED in $(($(date +%s) - start)) s"
		grep -E '^(--- FAIL|FAIL|panic)' "$logs/run$i.log" | head -20
		exit 1
	fi
done
echo "== $runs of $runs passed"

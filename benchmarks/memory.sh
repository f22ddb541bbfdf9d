#!/usr/bin/env bash
# Measures, with capstan's own processes on loopback:
#  1. a worker process started with a backlog of N requests queued: its peak
#     resident memory, and the drain throughput by tenths of the backlog (the
#     first tenth runs with the deepest queue);
#  2. the same drain with a backlog of SMALL requests;
#  3. one client awaiting AWAIT executions at once (one CallMany): its peak
#     resident memory and the JetStream consumers before and during the wait.
#
#   N=100000 SMALL=1000 AWAIT=10000 benchmarks/memory.sh
set -euo pipefail

N=${N:-100000}
SMALL=${SMALL:-1000}
AWAIT=${AWAIT:-10000}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
work=$(mktemp -d)
pids=()
trap stop_processes EXIT INT TERM

(cd "$here/.." && go build -o "$work/capstan" ./cmd/capstan)
capstan="$work/capstan"

"$capstan" server --store "$work/store" --listen 127.0.0.1:0 >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -qs "listening on" "$work/server.log" && break; sleep 0.05; done
url=$(sed -n 's/^capstan server listening on \([^ ]*\).*/\1/p' "$work/server.log")
export CAPSTAN_NATS_URL=$url

# start_worker starts a worker process and waits until it serves.
start_worker() {
	"$capstan" worker --concurrency 64 >"$work/worker.log" 2>&1 &
	worker=$!
	pids+=("$worker")
	for _ in $(seq 200); do grep -qs "worker started" "$work/worker.log" && break; sleep 0.05; done
}
stop_worker() { kill -TERM "$worker"; wait "$worker" 2>/dev/null || true; }
kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

# A first worker lists demo.echo in the catalog, so that the queued requests
# go straight to the pool.
start_worker
"$capstan" call demo.echo --input '{}' >/dev/null
stop_worker

# drain N: queue N requests with no worker running, then start one and time
# the drain; prints the bench's JSON and the worker's peak RSS.
drain() {
	local n=$1
	"$capstan" bench --workers 0 --backlog --n "$n" --concurrency 64 --no-baseline --json >"$work/drain.json" 2>"$work/drain.log" &
	local bench=$!
	pids+=("$bench")
	for _ in $(seq 6000); do grep -qs "queued" "$work/drain.log" && break; sleep 0.05; done
	start_worker
	local peak=0
	while kill -0 "$bench" 2>/dev/null; do
		rss=$(kb "$worker" VmRSS || echo 0)
		[ "${rss:-0}" -gt "$peak" ] && peak=$rss
		sleep 0.2
	done
	wait "$bench" || true
	hwm=$(kb "$worker" VmHWM)
	stop_worker
	python3 - "$work/drain.json" "$n" "$hwm" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"backlog {int(sys.argv[2]):>7}: drained at {r['executionsPerSec']:.0f}/s; by tenths "
      + " ".join(f"{d:.0f}" for d in r.get("decilesPerSec") or []) + f"; worker peak RSS {int(sys.argv[3]) / 1024:.0f} MB")
EOF
}

echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
drain "$N"
drain "$SMALL"

start_worker
"$capstan" bench --workers 0 --batch "$AWAIT" --concurrency 1 --n "$AWAIT" --no-baseline --json >"$work/await.json" 2>"$work/await.log" || true
stop_worker
python3 - "$work/await.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"one client awaiting {r['n']} at once: {r['completed']} completed in {r['elapsedSec']:.1f}s; "
      f"client peak RSS {r['peakRssMB']:.0f} MB; consumers {r['consumersBefore']} before, {r['consumersMax']} at most during the wait")
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# capstan bench on a 3-node cluster: three `capstan server` processes on
# loopback form a real JetStream cluster (every stream and bucket replicated
# three times), then `capstan bench --nats` runs N executions against it with
# its in-process worker, and the servers are stopped.
#
#   N=20000 BENCH_FLAGS="--no-baseline" benchmarks/cluster.sh
set -euo pipefail

N=${N:-20000}
BENCH_FLAGS=${BENCH_FLAGS:-}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
work=$(mktemp -d)
pids=()
trap stop_processes EXIT

(cd "$here/.." && go build -o "$work/capstan" ./cmd/capstan)

client=() cluster=()
for i in 1 2 3; do
	client+=("$(free_port)")
	cluster+=("$(free_port)")
done
urls=""
for i in 0 1 2; do
	routes=""
	for j in 0 1 2; do
		[ "$i" = "$j" ] && continue
		routes="${routes:+$routes,}nats://127.0.0.1:${cluster[$j]}"
	done
	"$work/capstan" server --name "n$((i + 1))" --store "$work/n$((i + 1))" --listen "127.0.0.1:${client[$i]}" \
		--cluster "127.0.0.1:${cluster[$i]}" --routes "$routes" >"$work/n$((i + 1)).log" 2>&1 &
	pids+=($!)
	urls="${urls:+$urls,}nats://127.0.0.1:${client[$i]}"
done
for i in 1 2 3; do
	for _ in $(seq 1 600); do
		grep -q "listening" "$work/n$i.log" && break
		sleep 0.1
	done
	grep -q "listening" "$work/n$i.log" || { echo "server n$i did not start:" >&2; cat "$work/n$i.log" >&2; exit 1; }
done
echo "cluster of three on $urls; load average $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086
"$work/capstan" bench --nats "$urls" --n "$N" $BENCH_FLAGS

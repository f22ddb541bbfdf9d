#!/usr/bin/env bash
# The TypeScript client against the Go client on the same machine and the
# same server: `capstan dev` on a free loopback port, then ROUNDS alternating
# runs of N calls of demo.echo with K in flight, the Go client's
# (`capstan bench --workers 0 --no-baseline`) and the TypeScript client's
# (bench/throughput.ts), each printed as one JSON line with the load average.
#
#   npm run build && bench/compare.sh [N] [K] [ROUNDS]
set -euo pipefail
exec </dev/null
cd "$(dirname "$0")/.."
N=${1:-5000}
K=${2:-256}
ROUNDS=${3:-5}

dir=$(mktemp -d)
trap 'kill "$dev" 2>/dev/null || true; wait "$dev" 2>/dev/null || true; rm -rf "$dir"' EXIT
(cd ../.. && go build -o "$dir/capstan" ./cmd/capstan)
"$dir/capstan" dev --listen 127.0.0.1:0 --store "$dir/store" --console off >"$dir/dev.out" 2>"$dir/dev.err" &
dev=$!
for _ in $(seq 600); do
	url=$(grep -o 'nats://[0-9.:]*' "$dir/dev.out" | head -1 || true)
	[[ -n "$url" ]] && break
	sleep 0.1
done
[[ -n "$url" ]] || { cat "$dir/dev.err"; exit 1; }

for r in $(seq "$ROUNDS"); do
	printf '{"round":%d,"load":"%s","result":%s}\n' "$r" "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)" \
		"$("$dir/capstan" bench --nats "$url" --workers 0 --no-baseline --n "$N" --concurrency "$K" --json 2>/dev/null | tr -d "\n ")"
	printf '{"round":%d,"load":"%s","result":%s}\n' "$r" "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)" \
		"$(node dist/bench/throughput.js --servers "$url" --n "$N" --concurrency "$K")"
done

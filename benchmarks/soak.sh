#!/usr/bin/env bash
# A soak: N executions of demo.echo at a fixed rate, with `capstan server`,
# `capstan worker` and `capstan bench --workers 0` as separate processes on
# loopback, sampled every INTERVAL: each process's resident memory, the
# server's Go heap, the store's size on disk and every stream's messages,
# subjects and interior deletes. Builds capstan and the soak command, runs
# the load, keeps sampling IDLE after it, stops every process it started and
# writes OUT/soak.csv, OUT/soak.png, OUT/server-heap.pb.gz (the server's heap
# profile at the end of the load: `go tool pprof -top OUT/server-heap.pb.gz`)
# and OUT/summary.txt (bytes of memory and disk per execution).
#
#   N=1000000 RATE=1000 SYNC=default INTERVAL=10s OUT=soak-out benchmarks/soak.sh
set -euo pipefail

N=${N:-200000}
RATE=${RATE:-1000}
SYNC=${SYNC:-default}
INTERVAL=${INTERVAL:-10s}
IDLE=${IDLE:-30s}
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/soak-out}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

(cd "$here/.." && go build -o "$bin/capstan" ./cmd/capstan)
(cd "$here" && go build -o "$bin/soak" ./soak)
"$bin/soak" --capstan "$bin/capstan" --n "$N" --rate "$RATE" --sync "$SYNC" --interval "$INTERVAL" --idle "$IDLE" --out "$OUT"

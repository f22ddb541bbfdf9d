#!/usr/bin/env bash
# A soak: N executions of demo.echo at a fixed rate, with `capstan server`,
# `capstan worker` and `capstan bench --workers 0` as separate processes on
# loopback, sampled every INTERVAL: each process's resident memory, the
# server's Go heap, the store's size on disk and every stream's messages,
# subjects and interior deletes. Builds capstan and the soak command, runs
# the load, keeps sampling IDLE after it, stops every process it started and
# writes OUT/soak.csv, OUT/soak.png, OUT/server-heap*.pb.gz (the server's heap
# profiles when each window filled, at the end of the load and after the
# idle time: `go tool pprof -top OUT/server-heap.pb.gz`) and OUT/summary.txt
# (bytes of memory per retained execution, the plateau once the windows are
# full, disk per execution).
#
# ENVELOPE_RETENTION is the server's --envelope-retention (default 25h),
# RECORD_WINDOW the worker's --record-window (default 15m); windows short
# enough to fill within the load show the server's memory level off.
#
#   N=1000000 RATE=1000 ENVELOPE_RETENTION=6m RECORD_WINDOW=2m IDLE=6m30s OUT=soak-out benchmarks/soak.sh
#   N=100000 RATE=250 SYNC=always ENVELOPE_RETENTION=3m RECORD_WINDOW=1m benchmarks/soak.sh
set -euo pipefail

N=${N:-200000}
RATE=${RATE:-1000}
SYNC=${SYNC:-default}
INTERVAL=${INTERVAL:-10s}
IDLE=${IDLE:-30s}
ENVELOPE_RETENTION=${ENVELOPE_RETENTION:-0}
RECORD_WINDOW=${RECORD_WINDOW:-0}
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/soak-out}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

(cd "$here/.." && go build -o "$bin/capstan" ./cmd/capstan)
(cd "$here" && go build -o "$bin/soak" ./soak)
"$bin/soak" --capstan "$bin/capstan" --n "$N" --rate "$RATE" --sync "$SYNC" --interval "$INTERVAL" --idle "$IDLE" \
	--envelope-retention "$ENVELOPE_RETENTION" --record-window "$RECORD_WINDOW" --out "$OUT"

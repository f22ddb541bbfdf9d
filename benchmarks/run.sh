#!/usr/bin/env bash
# Runs one workload on capstan (its no-op, and the same as a read without
# claims), JetStream alone (a work queue, and the server work of a capstan
# execution, a write's and a read's), asynq (Redis)
# and River (PostgreSQL) on this machine and prints one table: N no-op tasks
# enqueued by C producers and worked by C workers; throughput, latency, CPU
# time per task (the benchmark's process and the system's own server
# processes), and how many times capstan's throughput each system's is.
#
# Installs redis-server and postgresql from Debian's packages when missing,
# starts each on loopback on a free port with a temporary directory, and stops
# them at the end. Each store writes every task to disk without an fsync per
# task, as the JetStream file store does: PostgreSQL with
# synchronous_commit=off, Redis with its append-only file (fsync every second).
# River runs twice: with its defaults, and with a 5 ms fetch cooldown (its
# default 100 ms caps it near concurrency / 100 ms). Every system runs ROUNDS
# times, in turn, and keeps its best round, so that a burst of other load on
# the machine does not decide the table.
#
#   N=20000 C=64 ROUNDS=2 benchmarks/run.sh
set -euo pipefail

N=${N:-20000}
ROUNDS=${ROUNDS:-2}
C=${C:-64}
PAYLOAD=${PAYLOAD:-64}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ -n "$(pg_bin)" ] || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}" >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
PG=$(pg_bin)

work=$(mktemp -d)
chmod 755 "$work"
redis_pid=""
pg_user=$(id -un)
if [ "$(id -u)" -eq 0 ]; then pg_user=postgres; fi
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

cleanup() {
	if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
	if [ -f "$work/pg/postmaster.pid" ]; then as_pg "$PG/pg_ctl" -D "$work/pg" -m immediate -w stop >/dev/null 2>&1 || true; fi
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Redis: loopback only, append-only file, no snapshots.
redis_port=$(free_port)
mkdir -p "$work/redis"
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" --save '' \
	--appendonly yes --appendfsync everysec --daemonize no \
	--logfile "$work/redis/log" &
redis_pid=$!

# PostgreSQL: a throwaway cluster in the temporary directory, loopback only.
pg_port=$(free_port)
mkdir -p "$work/pg" "$work/pgsock"
if [ "$(id -u)" -eq 0 ]; then chown postgres "$work/pg" "$work/pgsock"; fi
as_pg "$PG/initdb" -D "$work/pg" -U "$pg_user" --auth=trust -E UTF8 >"$work/initdb.log" 2>&1
as_pg "$PG/pg_ctl" -D "$work/pg" -l "$work/pgsock/log" -w \
	-o "-c listen_addresses=127.0.0.1 -p $pg_port -k $work/pgsock -c synchronous_commit=off -c max_connections=200" start >/dev/null
as_pg "$PG/createdb" -h 127.0.0.1 -p "$pg_port" -U "$pg_user" bench

for _ in $(seq 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
	sleep 0.05
done

cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
echo "machine: $(nproc) CPUs (${cpu_model:-unknown}), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$here"
go run . -n "$N" -concurrency "$C" -payload "$PAYLOAD" -rounds "$ROUNDS" \
	-redis "127.0.0.1:$redis_port" -redis-pid "$redis_pid" \
	-pg "postgres://$pg_user@127.0.0.1:$pg_port/bench?sslmode=disable" -pg-pid "$(head -n 1 "$work/pg/postmaster.pid")"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Functions the benchmark scripts share; sourced, not run.

# free_port prints a loopback TCP port nothing listens on.
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 20000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

# stop_processes stops every process whose pid the script added to pids and
# removes its temporary directory, work: the scripts' exit trap.
stop_processes() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}

#!/usr/bin/env bash
# A library's weight: what a program links by importing one of capstan's
# library packages stays the NATS client, msgpack, uuid and what the package
# itself is about (Prometheus for telemetry, the MCP SDK for mcpbridge). The
# server, gRPC, the OpenTelemetry exporters and a browser belong to the
# binaries: cmd/capstan, capstantest (an embedded server, for
# tests, by design) and telemetry/otlp (the OTLP wiring a program chooses to
# import).
#
# Every package outside cmd/, internal/ and scripts/ is checked (examples/hello, a
# worker and a client as a user writes them, included) unless it is excluded
# here; a new one is checked from the start.
set -euo pipefail
cd "$(dirname "$0")/.."

module=$(go list -m)
excluded="^$module/(cmd/|internal/|scripts/|capstantest\$|telemetry/otlp\$)"
forbidden='^(github\.com/nats-io/nats-server/|google\.golang\.org/grpc(/|$)|go\.opentelemetry\.io/otel/exporters/|github\.com/chromedp/)'

mapfile -t libraries < <(go list ./... | grep -Ev "$excluded")
failed=0
for pkg in "${libraries[@]}"; do
	bad=$(go list -deps "$pkg" | grep -E "$forbidden" || true)
	if [[ -n "$bad" ]]; then
		failed=1
		echo "$pkg links what a library must not:"
		awk 'NR <= 5 { print "\t" $0 } END { if (NR > 5) print "\t… and " NR - 5 " more" }' <<<"$bad"
		# Who brings it in: the packages outside the forbidden set that
		# import one of them.
		go list -deps -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' "$pkg" |
			awk -v re="$forbidden" '$1 !~ re { for (i = 2; i <= NF; i++) if ($i ~ re) { print "	imported by " $1 " (" $i ")"; break } }'
	fi
done
if [[ $failed == 1 ]]; then
	exit 1
fi
echo "${#libraries[@]} library packages link no nats-server, gRPC, OpenTelemetry exporter or chromedp:"
printf '	%s\n' "${libraries[@]#"$module"/}"

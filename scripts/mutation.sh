#!/usr/bin/env bash
# Mutation run: how many deliberate bugs in the packages that hold capstan's
# invariants their tests catch. A measurement, not a CI gate: it takes tens of
# minutes and its score is read, not enforced.
#
#   scripts/mutation.sh                  # internal/approvalstore and envelope
#   scripts/mutation.sh envelope         # one package
#   WORKERS=2 scripts/mutation.sh        # mutants tested at once (default 1)
#
# Each package's mutants are run against that package's own tests (gremlins
# mutates only code those tests cover). The engine (executor/internal/engine,
# executor/internal/sweeper) has its rules table-tested in its own package,
# and its wiring proven by the executor package's black-box tests, which take
# minutes per run: its mutants are listed, each with the tests that should
# catch it, and run by scripts/mutate-delivery.sh.
#
# Results: a JSON file per package in $OUT (default: a new temporary
# directory), and every mutant that lived on stdout.
set -euo pipefail
exec </dev/null
cd "$(dirname "$0")/.."

GREMLINS=github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
OUT=${OUT:-$(mktemp -d)}
WORKERS=${WORKERS:-1}
pkgs=("$@")
if [[ ${#pkgs[@]} -eq 0 ]]; then
	pkgs=(internal/approvalstore envelope)
fi

for p in "${pkgs[@]}"; do
	printf '\n== %s\n' "$p"
	go run "$GREMLINS" unleash \
		--invert-logical \
		--workers "$WORKERS" --test-cpu 1 --timeout-coefficient "${TIMEOUT_COEFFICIENT:-40}" \
		--output "$OUT/${p//\//_}.json" \
		"./$p"
done
printf '\nresults in %s\n' "$OUT"

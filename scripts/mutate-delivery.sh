#!/usr/bin/env bash
# Mutation run of the engine (executor/internal/engine: claim, lease, the
# takeover table, attempts, finalization; executor/internal/sweeper), of the
# retry rule (executor/stages.go, SI-11) and of the deployment's one record
# window (broker). Each mutant names the tests that should catch it: first
# a unit test of its own file's package named after the rule it breaks
# (seconds), then the executor package's black-box tests, too slow to run
# whole per mutant. A mutant that changes no behaviour says so: what it
# breaks begins "equivalent: " and says why (scripts/mutants checks both).
# A measurement, not a CI gate.
#
#   scripts/mutate-delivery.sh                  # every mutant in scripts/mutants-delivery.tsv
#   scripts/mutate-delivery.sh D03 R01          # some, by id
#   TIMEOUT=240 scripts/mutate-delivery.sh      # seconds per mutant (default 300)
#
# Each line of the list is: id, file, test pattern (go test -run; the
# executor's tests, or another package's as ./path/:pattern; several, run in
# turn until one fails, joined by ;), the exact
# text to replace (it must occur once), its replacement, and what the mutant
# breaks; fields are separated by tabs, \n in a text is a newline, and \&
# separates several replacements in one file that make one mutant. The run
# works on a copy of the tree: the checkout is never changed. A mutant whose
# tests fail (or time out) is killed; one whose tests pass lived; one that
# does not compile is reported as such and not counted.
set -euo pipefail
exec </dev/null
cd "$(dirname "$0")/.."
root=$PWD
list=${LIST:-$root/scripts/mutants-delivery.tsv}
timeout_s=${TIMEOUT:-300}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar --exclude=.git -cf - . | tar -xf - -C "$work"

killed=0 lived=0 equivalent=0 broken=0
survivors=()
while IFS=$'\t' read -r id file tests old new what; do
	[[ -z $id || $id == \#* ]] && continue
	if [[ $# -gt 0 ]] && ! printf '%s\n' "$@" | grep -qx "$id"; then
		continue
	fi
	cp "$root/$file" "$work/$file"
	if ! OLD=$old NEW=$new python3 - "$work/$file" <<'PY'; then
import os, sys
p = sys.argv[1]
old = os.environ["OLD"].replace("\\n", "\n").replace("\\t", "\t")
new = os.environ["NEW"].replace("\\n", "\n").replace("\\t", "\t")
src = open(p).read()
for o, n in zip(old.split("\\&"), new.split("\\&")):
    if src.count(o) != 1:
        sys.exit("text to replace occurs %d times" % src.count(o))
    src = src.replace(o, n)
open(p, "w").write(src)
PY
		printf '%s\tSTALE\t%s\n' "$id" "$what"
		broken=$((broken + 1))
		continue
	fi
	start=$SECONDS
	rc=0
	: >"$work/.out"
	IFS=';' read -ra runs <<<"$tests"
	for run in "${runs[@]}"; do
		pkg=./executor/ pattern=$run
		if [[ $run == *:* ]]; then
			pkg=${run%%:*} pattern=${run#*:}
		fi
		set +e
		(cd "$work" && timeout -k 10 $((timeout_s + 30)) go test "$pkg" -count=1 -failfast -timeout "${timeout_s}s" -run "$pattern" >>"$work/.out" 2>&1)
		rc=$?
		set -e
		[[ $rc -ne 0 ]] && break
	done
	cp "$root/$file" "$work/$file"
	if grep -q '\[build failed\]\|\[setup failed\]' "$work/.out"; then
		verdict=UNBUILT
		broken=$((broken + 1))
	elif [[ $rc -eq 0 && $what == equivalent:* ]]; then
		verdict=EQUIVALENT
		equivalent=$((equivalent + 1))
	elif [[ $rc -eq 0 ]]; then
		verdict=LIVED
		lived=$((lived + 1))
		survivors+=("$id")
	else
		verdict=KILLED
		grep -q "panic: test timed out" "$work/.out" && verdict=KILLED-timeout
		killed=$((killed + 1))
		by=$(grep -o -- '--- FAIL: [A-Za-z0-9_/]*' "$work/.out" | head -1 | cut -d" " -f3 || true)
		what="$what (${by:-panic or timeout})"
	fi
	printf '%s\t%s\t%ss\t%s\n' "$id" "$verdict" $((SECONDS - start)) "$what"
done <"$list"
total=$((killed + lived))
printf '\nkilled %d, lived %d, equivalent (lived) %d, not built %d' "$killed" "$lived" "$equivalent" "$broken"
[[ $total -gt 0 ]] && printf ', score %d%%' $((100 * killed / total))
printf '\n'
[[ ${#survivors[@]} -gt 0 ]] && printf 'lived: %s\n' "${survivors[*]}"
exit 0

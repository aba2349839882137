#!/usr/bin/env bash
# One phase of `make test`: runs COMMAND, printing a line when it starts, one every 50 s while it
# runs (so that no phase is silent for a minute, even while it builds or runs a quiet suite), and
# one when it ends: its cargo tests passed and failed (summed over the harness's `test result:`
# lines), its script checks (lines starting `ok ` or `NAME: ok`), the crates cargo built or
# checked (none when everything was up to date) and its duration. The exit
# status is COMMAND's.
#   scripts/phase.sh NAME COMMAND [ARGS...]
set -uo pipefail
name=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/fallow-phase.XXXXXX")
start=$SECONDS
echo "== $name: starting ($*)"
(
    n=0
    while sleep 5; do
        n=$((n + 5))
        ((n % 50 == 0)) && echo "== $name: still running, ${n} s"
    done
) &
beat=$!
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
kill "$beat" 2>/dev/null
wait "$beat" 2>/dev/null
counts=$(awk '/^test result: /{p += $4; f += $6; n++} /^ok |^[a-z-]+: ok/{c++} /^ *(Compiling|Checking) /{b++}
    END {printf "%d cargo tests passed, %d failed (%d suites); %d script checks ok; %d crates built or checked",
        p, f, n, c, b}' "$log")
rm -f "$log"
status=$([[ $rc == 0 ]] && echo passed || echo "FAILED (exit $rc)")
echo "== $name: $status: $counts; $((SECONDS - start)) s"
exit "$rc"

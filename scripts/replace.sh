#!/bin/sh
# Memory held by many live blocks replaced at random (scripts/replace.c: N blocks of LO-HI bytes,
# a random half freed and taken again ROUNDS times, every block written whole), under glibc and
# under fallow's preload library, interleaved: RUNS runs of each (default 3), medians of the wall
# time, the resident memory at the end and the peak (MiB), and the minor faults. Build the
# preload library first: `cargo build --release -p fallow-preload`. Usage: scripts/replace.sh
# [LO-HI:N ...] (bytes with k or m; default 256k-1m:800 1m-4m:200 4m-16m:50: about 500 MiB live
# each). Environment: RUNS, ROUNDS (default 20), LIB (the preload library, default
# target/release/libfallow_preload.so), BEFORE (another build of it: more rows, interleaved).
lib=${LIB:-$PWD/target/release/libfallow_preload.so}
bin=${TMPDIR:-/tmp}/replace.$$
cc -O2 -o "$bin" scripts/replace.c || exit 1
trap 'rm -f "$bin"' EXIT
runs=${RUNS:-3}
rounds=${ROUNDS:-20}
bytes() { echo "$1" | awk '/[kK]$/ {print $1*1024; next} /[mM]$/ {print $1*1048576; next} {print $1}'; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-14s %-7s %8s %9s %9s %9s %9s\n' shape peer wall_s live_mib end_mib peak_mib faults
for shape in ${@:-256k-1m:800 1m-4m:200 4m-16m:50}; do
    sizes=${shape%%:*}
    n=${shape##*:}
    lo=$(bytes "${sizes%%-*}")
    hi=$(bytes "${sizes##*-}")
    peers="glibc fallow"
    [ -n "$BEFORE" ] && peers="glibc before fallow"
    out=${TMPDIR:-/tmp}/replace.out.$$
    : > "$out"
    i=0
    while [ $i -lt "$runs" ]; do
        for peer in $peers; do
            case $peer in
                glibc) pre= ;;
                before) pre=$BEFORE ;;
                fallow) pre=$lib ;;
            esac
            echo "$peer $(LD_PRELOAD=$pre "$bin" "$lo" "$hi" "$n" "$rounds")" >> "$out"
        done
        i=$((i + 1))
    done
    for peer in $peers; do
        col() { grep "^$peer " "$out" | awk -v c="$1" '{print $c}' | tr '\n' ' ' | median; }
        printf '%-14s %-7s %8s %9s %9s %9s %9s\n' "$shape" "$peer" "$(col 2)" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)"
    done
    rm -f "$out"
done

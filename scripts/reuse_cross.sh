#!/bin/sh
# Calls per second of scripts/reuse_cross.c (malloc or calloc, memset, free of sizes uniform in
# [B/2, 1.375*B]) under glibc and under fallow's preload library, interleaved: RUNS runs of each
# (default 5) per B and mode, medians, and fallow / glibc. Build the preload library first:
# `cargo build --release -p fallow-preload`. Usage: scripts/reuse_cross.sh [B...] (bytes, with
# k or m; default 256k 512k 1m 2m 4m 8m). Environment: RUNS, SECONDS_PER_RUN (default 0.3),
# LIB (the preload library, default target/release/libfallow_preload.so), BEFORE (another
# build of it, e.g. of an older commit: a third column, interleaved with the other two), MODES
# (default "m c": malloc, calloc), THREADS (threads running the loop at once, default 1).
set -e
cd "$(dirname "$0")/.."
lib=${LIB:-$PWD/target/release/libfallow_preload.so}
bin=${TMPDIR:-/tmp}/reuse_cross.$$
cc -O2 -pthread -o "$bin" scripts/reuse_cross.c
trap 'rm -f "$bin"' EXIT
runs=${RUNS:-5}
secs=${SECONDS_PER_RUN:-0.3}
threads=${THREADS:-1}
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
bytes() { echo "$1" | awk '/[kK]$/ {print $1*1024; next} /[mM]$/ {print $1*1048576; next} {print $1}'; }
if [ -n "$BEFORE" ]; then
    printf '%-6s %-6s %10s %10s %10s %7s %7s\n' B call glibc before fallow before after
else
    printf '%-6s %-6s %10s %10s %7s\n' B call glibc fallow ratio
fi
for bs in ${@:-256k 512k 1m 2m 4m 8m}; do
    b=$(bytes "$bs")
    for mode in ${MODES:-m c}; do
        g=; f=; o=
        i=0
        while [ $i -lt "$runs" ]; do
            g="$g $("$bin" "$b" $mode "$secs" "$threads")"
            [ -n "$BEFORE" ] && o="$o $(LD_PRELOAD=$BEFORE "$bin" "$b" $mode "$secs" "$threads")"
            f="$f $(LD_PRELOAD=$lib "$bin" "$b" $mode "$secs" "$threads")"
            i=$((i + 1))
        done
        gm=$(echo $g | median)
        fm=$(echo $f | median)
        name=malloc; [ $mode = c ] && name=calloc
        if [ -n "$BEFORE" ]; then
            om=$(echo $o | median)
            printf '%-6s %-6s %10s %10s %10s %7.3f %7.3f\n' "$bs" $name "$gm" "$om" "$fm" \
                "$(echo "$om $gm" | awk '{print $1/$2}')" "$(echo "$fm $gm" | awk '{print $1/$2}')"
        else
            printf '%-6s %-6s %10s %10s %7.3f\n' "$bs" $name "$gm" "$fm" "$(echo "$fm $gm" | awk '{print $1/$2}')"
        fi
    done
done

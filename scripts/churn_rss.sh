#!/bin/sh
# Peak RSS of scripts/churn_rss.c (two threads replacing 64 KiB-4 MiB blocks, calloc or malloc)
# under glibc and under fallow's preload library, interleaved: RUNS runs of each (default 5),
# medians of the peak RSS and of what the allocator held beyond the peak live data, in MiB.
# Build the preload library first: `cargo build --release -p fallow-preload`. Environment: RUNS,
# STEPS (default 3000), LIB (the preload library, default target/release/libfallow_preload.so),
# BEFORE (another build of it: a third row, interleaved), MODES (default "c m": calloc, malloc).
set -e
cd "$(dirname "$0")/.."
lib=${LIB:-$PWD/target/release/libfallow_preload.so}
bin=${TMPDIR:-/tmp}/churn_rss.$$
cc -O2 -pthread -o "$bin" scripts/churn_rss.c
trap 'rm -f "$bin"' EXIT
runs=${RUNS:-5}
steps=${STEPS:-3000}
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-6s %-8s %12s %14s\n' call peer "peak RSS MiB" "beyond live MiB"
for mode in ${MODES:-c m}; do
    peers="glibc fallow"
    [ -n "$BEFORE" ] && peers="glibc before fallow"
    for p in $peers; do eval "rss_$p=; over_$p="; done
    i=0
    while [ $i -lt "$runs" ]; do
        for p in $peers; do
            case $p in glibc) pre= ;; before) pre=$BEFORE ;; fallow) pre=$lib ;; esac
            set -- $(LD_PRELOAD=$pre "$bin" "$steps" $mode)
            eval "rss_$p=\"\$rss_$p $(($1 / 1024))\"; over_$p=\"\$over_$p $((($1 - $2) / 1024))\""
        done
        i=$((i + 1))
    done
    name=calloc; [ $mode = m ] && name=malloc
    for p in $peers; do
        eval "r=\$rss_$p; o=\$over_$p"
        printf '%-6s %-8s %12s %14s\n' $name $p "$(echo $r | median)" "$(echo $o | median)"
    done
done

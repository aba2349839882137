#!/bin/sh
# How often the hot reuse loop's own memset leaves the CPU's L2 (scripts/reuse_cross.c by count:
# malloc or calloc, memset, free of sizes uniform in [B/2, 1.375*B], CALLS times), under glibc and under
# fallow's preload library, with small objects off and on: cachegrind with its last level set to
# L2 bytes (default 524288, 8-way), which gives the same count every run where this loop's times
# move by 10-15% on a shared machine. Needs valgrind; build the preload library first (`cargo
# build --release -p fallow-preload`). Usage: scripts/reuse_l2.sh [B...] (bytes, with k or m;
# default 256k 384k). Environment: CALLS (default 1500), L2 (bytes), MODES (default "m c"), LIB
# (the preload library), BEFORE (another build of it: more columns).
set -e
cd "$(dirname "$0")/.."
lib=${LIB:-$PWD/target/release/libfallow_preload.so}
bin=${TMPDIR:-/tmp}/reuse_l2.$$
cc -O2 -pthread -o "$bin" scripts/reuse_cross.c
trap 'rm -f "$bin"' EXIT
calls=${CALLS:-1500}
l2=${L2:-524288}
bytes() { echo "$1" | awk '/[kK]$/ {print $1*1024; next} /[mM]$/ {print $1*1048576; next} {print $1}'; }
misses() {
    env "$@" valgrind --tool=cachegrind --cache-sim=yes --LL="$l2,8,64" --cachegrind-out-file=/dev/null \
        "$bin" "$size" "$mode" "${calls}x" 2>&1 | awk '/LL misses/ {gsub(",", "", $4); print $4}'
}
head="B mode glibc fallow fallow-small"
[ -n "$BEFORE" ] && head="$head before before-small"
echo "$head   (L2 misses of $calls calls)"
for b in ${@:-256k 384k}; do
    size=$(bytes "$b")
    for mode in ${MODES:-m c}; do
        row="$b $mode $(misses X=1) $(misses LD_PRELOAD="$lib") $(misses FALLOW_SMALL=1 LD_PRELOAD="$lib")"
        [ -n "$BEFORE" ] && row="$row $(misses LD_PRELOAD="$BEFORE") $(misses FALLOW_SMALL=1 LD_PRELOAD="$BEFORE")"
        echo "$row"
    done
done

#!/usr/bin/env bash
# Instructions per malloc/free pair (callgrind), glibc alone and through the preload library with
# the workers off: `scripts/count-pair.sh [SIZE] [MODE]` (default 524288: requests of 256-512 KiB;
# MODE `c` for calloc, `r` for a 16-byte malloc grown by realloc; with `+` (`m+`, `c+`, `r+`)
# after one kept 1 MiB request, so that the preload's allocator and its arena exist). Two runs of
# 1,000 and 11,000 pairs; the difference over 10,000 leaves out start-up and exit. With SMALL=1,
# a third line counts the preload with small objects on (FALLOW_SMALL=1).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-524288}
mode=${2:-m}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -o "$out/pair_loop" scripts/pair_loop.c
cargo build --release -q -p fallow-preload
# `refs N VAR=VALUE...`: instructions of N pairs, with the given environment (LD_PRELOAD reaches
# the program valgrind runs, not valgrind).
refs() {
    local n=$1
    shift
    env "$@" valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$out/pair_loop" "$size" "$n" "$mode" 2>&1 |
        awk '/refs:/ {gsub(",", "", $4); print $4}'
}
count() {
    local a b
    a=$(refs 1000 "$@")
    b=$(refs 11000 "$@")
    echo $(( (b - a) / 10000 ))
}
echo "glibc:  $(count) instructions per pair"
echo "fallow: $(count LD_PRELOAD="$PWD/target/release/libfallow_preload.so" FALLOW_ZEROING=off FALLOW_REPORT=off) instructions per pair"
if [[ ${SMALL:-0} == 1 ]]; then
    echo "fallow, FALLOW_SMALL=1: $(count LD_PRELOAD="$PWD/target/release/libfallow_preload.so" FALLOW_ZEROING=off FALLOW_REPORT=off FALLOW_SMALL=1) instructions per pair"
fi

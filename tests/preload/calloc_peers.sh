#!/usr/bin/env bash
# calloc(256 MiB) + touch + free + 50 ms pause, 20 times, under glibc, jemalloc, mimalloc, tcmalloc
# (Debian's libraries, by LD_PRELOAD) and fallow; each allocator 3 times in turn, medians taken
# by eye from the printed lines. Installs the Debian packages when missing.
#   tests/preload/calloc_peers.sh [iterations] [MiB] [pause_ms]
set -euo pipefail
cd "$(dirname "$0")/../.."
pkgs=(libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4)
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"; break; }
done
cargo build --release -q -p fallow-preload
mkdir -p target/capi-tests
gcc -O2 -fno-builtin -o target/capi-tests/calloc_loop tests/preload/calloc_loop.c
lib=/usr/lib/x86_64-linux-gnu
declare -A so=(
    [glibc]=""
    [jemalloc]=$lib/libjemalloc.so.2
    [mimalloc]=$(ls $lib/libmimalloc.so.2* | head -1)
    [tcmalloc]=$lib/libtcmalloc_minimal.so.4
    [fallow]=$PWD/target/release/libfallow_preload.so
)
for round in 1 2 3; do
    for a in glibc jemalloc mimalloc tcmalloc fallow; do
        printf '%-9s round %d: ' "$a" "$round"
        LD_PRELOAD=${so[$a]} target/capi-tests/calloc_loop "${1:-20}" "${2:-256}" "${3:-50}"
    done
done

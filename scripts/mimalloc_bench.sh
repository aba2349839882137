#!/bin/bash
# mimalloc-bench's small-object tests (its public repository, built by hand as
# shared/mimalloc-bench.md says; nothing of it in this tree) under glibc, Debian's jemalloc,
# mimalloc and TCMalloc, and fallow's preload library with FALLOW_SMALL=1 (and =0), each peer
# in turn per round: `scripts/mimalloc_bench.sh BENCH_DIR [ROUNDS]`, BENCH_DIR its `out/bench`
# (the built tests; espresso's input is read from ../../bench/espresso). Prints per test and
# peer `/usr/bin/time`'s wall s, user s, system s, max RSS KiB, and the test's own figure where
# it prints one. Build the preload library first: `cargo build --release -p fallow-preload`.
set -u
dir=${1:?usage: scripts/mimalloc_bench.sh BENCH_DIR [ROUNDS]}
rounds=${2:-1}
so=$(cd "$(dirname "$0")/.." && pwd)/target/release/libfallow_preload.so
lib=/usr/lib/x86_64-linux-gnu
cd "$dir" || exit 1
tests=(
    "cfrac ./cfrac 17545186520507317056371138836327483792789528"
    "espresso ./espresso ../../bench/espresso/largest.espresso"
    "larson ./larson 5 8 1000 5000 100 4141 2"
    "xmalloc-test ./xmalloc-test -w 2 -t 5 -s 64"
    "glibc-simple ./glibc-simple"
    "glibc-thread ./glibc-thread 2"
    "mstress ./mstress 2 50 25"
    "alloc-test ./alloc-test 2"
    "rptest ./rptest 2 0 1 2 500 1000 100 8 16000"
)
peers=(glibc jemalloc mimalloc tcmalloc fallow fallow-small)
for t in "${tests[@]}"; do
    name=${t%% *}
    cmd=${t#* }
    for r in $(seq "$rounds"); do
        for p in "${peers[@]}"; do
            case $p in
                glibc) pre= ;;
                jemalloc) pre=$lib/libjemalloc.so.2 ;;
                mimalloc) pre=$(ls $lib/libmimalloc.so.* 2>/dev/null | head -1) ;;
                tcmalloc) pre=$lib/libtcmalloc_minimal.so.4 ;;
                fallow | fallow-small) pre=$so ;;
            esac
            small=0; [ $p = fallow-small ] && small=1
            out=$(FALLOW_SMALL=$small LD_PRELOAD=$pre /usr/bin/time -f "TIME %e %U %S %M" $cmd 2>&1)
            own=$(echo "$out" | grep -Eo '([0-9.]+ memory ops/CPU second|Throughput = +[0-9]+|[0-9]+ iterations|free/sec: [0-9.]+ M)' | tail -1)
            printf '%-13s %d %-13s %s  %s\n' "$name" "$r" "$p" "$(echo "$out" | grep '^TIME' | cut -d' ' -f2-)" "$own"
        done
    done
done

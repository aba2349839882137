#!/usr/bin/env bash
# Tests of the C API and the LD_PRELOAD library (issue 7). Run from anywhere; works on a fresh
# Debian machine (installs what it lacks, idempotently). About 8 minutes, most of it a part of
# numpy's numpy._core suite run twice (without and with the preload).
#   scripts/test-capi.sh            everything
#   SKIP_NUMPY=1 scripts/test-capi.sh   without the numpy suite
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/capi-tests
mkdir -p "$out"

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; exit 1; }

step "system packages"
missing=()
for pkg in gcc pkg-config python3-venv python3-pip file time; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || fail "missing ${missing[*]}; installing them with apt-get needs root"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

step "cargo build --release and unit tests"
cargo build --release -p fallow-capi -p fallow-preload
for f in libfallow.so libfallow.a libfallow_preload.so fallow.pc; do
    [[ -f target/release/$f ]] || fail "target/release/$f missing"
done
# The two shared libraries carry their unwinder (crates/static_unwinder.rs): a process they are
# loaded into does not load libgcc_s for them.
for f in libfallow.so libfallow_preload.so; do
    needed=$(readelf -d "target/release/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    echo "$f needs: $needed"
    [[ $needed == *libc.so.6* && $needed != *libgcc_s* ]] || fail "$f needs $needed"
    # Its copy stays private: a program's own C++ exceptions keep libgcc_s's.
    if nm -D --defined-only "target/release/$f" | grep -E '_Unwind_|__register_frame|__gcc_personality'; then
        fail "$f exports the unwinder"
    fi
done
# In release, as `make test`'s other phases build (run from `make test`, test-rust ran these
# already and nothing is rebuilt).
cargo test -q --release -p fallow-preload
# The start-up, the settings parser, the fatal path and the fork registry, shared by FallowAlloc,
# the preload and the C API.
cargo test -q --release -p fallow --lib -- global:: env:: message:: start:: allocator::fork::
cargo test -q --release -p fallow --test global_alloc --test global_start --test limits

step "C API test (shared library through pkg-config, and static library)"
export PKG_CONFIG_PATH=$root/target/release
# `shared_and_static NAME WHAT`: tests/c/NAME.c built against the shared library (through
# pkg-config) and against the static one, both run; WHAT names it when the static one fails.
shared_and_static() {
    gcc -O2 -Wall -Werror -fno-builtin -o "$out/$1" "tests/c/$1.c" $(pkg-config --cflags --libs fallow) -lpthread
    gcc -O2 -Wall -Werror -o "$out/${1}_static" "tests/c/$1.c" -Iinclude target/release/libfallow.a -lpthread -ldl -lm
    "$out/$1"
    "$out/${1}_static" > "$out/${1}_static.log" || { cat "$out/${1}_static.log"; fail "static $2"; }
    echo "static: $(grep -c '^ok' "$out/${1}_static.log") ok"
}
shared_and_static capi_test "C API test"

step "C API test with small objects on (shared and static library)"
shared_and_static capi_small_test "C API small-object test"

step "C API around fork: threads in the allocators, allocators made and destroyed (shared and static library)"
shared_and_static capi_fork_test "C API fork test"

step "preload tests"
so=$root/target/release/libfallow_preload.so
gcc -O2 -g -Wall -Wno-free-nonheap-object -Wno-alloc-size-larger-than -fno-builtin -Iinclude -o "$out/preload_test" tests/c/preload_test.c -lpthread -ldl
LD_PRELOAD=$so "$out/preload_test"
# Workers off: the test checks that recycled dirty pages are memset on the allocation path.
FALLOW_ZEROING=off FALLOW_REPORT=off FALLOW_ARENA_SIZE=1g LD_PRELOAD=$so "$out/preload_test" calloc_recycled
# Workers off: a cached block the zeroing worker zeroed would serve the test's `calloc`.
FALLOW_ZEROING=off FALLOW_REPORT=off LD_PRELOAD=$so "$out/preload_test" hot_below
LD_PRELOAD=$so "$out/preload_test" fork_exec
# In fresh processes: large first requests racing while the allocator is created are all
# fallow's; under RLIMIT_AS = 4 GiB the allocator is created and a request beyond it is ENOMEM.
LD_PRELOAD=$so "$out/preload_test" start_race
(ulimit -v 4194304 && LD_PRELOAD=$so "$out/preload_test" rlimit)
FALLOW_THRESHOLD=1m LD_PRELOAD=$so "$out/preload_test" threshold 1048576
LD_PRELOAD=$so "$out/preload_test" threshold 262144
# A bad setting: one warning naming the variable and the default, and the program runs on.
FALLOW_THRESHOLD=lots FALLOW_REPORT=sometimes LD_PRELOAD=$so "$out/preload_test" threshold 262144 2> "$out/warn.log"
cat "$out/warn.log"
[[ $(grep -c 'FALLOW_THRESHOLD="lots".*default 262144' "$out/warn.log") == 1 ]] || fail "FALLOW_THRESHOLD warning"
[[ $(grep -c 'FALLOW_REPORT="sometimes".*default dontneed' "$out/warn.log") == 1 ]] || fail "FALLOW_REPORT warning"
[[ $(wc -l < "$out/warn.log") == 2 ]] || fail "expected exactly two warnings"
# Values out of range: one warning each naming the value used, which applies.
FALLOW_THRESHOLD=100 FALLOW_ARENA_SIZE=100m LD_PRELOAD=$so "$out/preload_test" threshold 4096 2> "$out/warn.log"
cat "$out/warn.log"
[[ $(grep -c 'FALLOW_THRESHOLD="100" is below one page.*; using 4096$' "$out/warn.log") == 1 ]] || fail "FALLOW_THRESHOLD range warning"
[[ $(grep -c 'FALLOW_ARENA_SIZE="100m" is below the largest block.*; using 1073741824$' "$out/warn.log") == 1 ]] || fail "FALLOW_ARENA_SIZE range warning"
[[ $(wc -l < "$out/warn.log") == 2 ]] || fail "expected exactly two warnings"
# FALLOW_STATS=1 names never-used address space apart: a 64 MiB program in a 1 GiB arena has
# most of it never used and nothing given back (reporting held off by an hour's delay).
LD_PRELOAD=$so FALLOW_STATS=1 FALLOW_ARENA_SIZE=1g FALLOW_REPORT_DELAY_MS=3600000 \
    python3 -c 'b = bytearray(64 << 20); b[::4096] = b"x" * (16 << 10)' 2> "$out/stats64.log"
figure() { sed -n "s/^fallow:     $1  *\([0-9.]*\) MiB.*/\1/p" "$out/stats64.log"; }
grep -q "address space reserved: 1024.0 MiB in 1 arena" "$out/stats64.log" || { cat "$out/stats64.log"; fail "reserved line"; }
awk -v n="$(figure 'never used')" -v r="$(figure 'free, reported')" -v d="$(figure 'free, dirty')" \
    'BEGIN { exit !(n >= 900 && n <= 960 && r == 0 && d >= 64) }' \
    || { head -12 "$out/stats64.log"; fail "FALLOW_STATS summary of a 64 MiB program"; }
echo "ok FALLOW_STATS=1: never used $(figure 'never used') MiB, reported $(figure 'free, reported') MiB"
# The caches' settings: applied (FALLOW_CACHE=off: no cache hit), and a bad one warns once.
hits() { sed -n 's/.*cache_hits: *\([0-9]*\).*/\1/p' "$1"; }
loop='import time
for i in range(200): b = bytearray(512 << 10)'
LD_PRELOAD=$so FALLOW_STATS=1 python3 -c "$loop" 2> "$out/cache_on.log"
FALLOW_CACHE=off LD_PRELOAD=$so FALLOW_STATS=1 python3 -c "$loop" 2> "$out/cache_off.log"
[[ $(hits "$out/cache_on.log") -gt 0 && $(hits "$out/cache_off.log") == 0 ]] \
    || fail "FALLOW_CACHE=off: cache_hits $(hits "$out/cache_on.log") on, $(hits "$out/cache_off.log") off"
FALLOW_CACHE_MAX_ORDER=12 LD_PRELOAD=$so "$out/preload_test" threshold 262144 2> "$out/warn.log"
cat "$out/warn.log"
[[ $(grep -c 'FALLOW_CACHE_MAX_ORDER="12" is above 11; using 11$' "$out/warn.log") == 1 ]] || fail "FALLOW_CACHE_MAX_ORDER warning"
[[ $(wc -l < "$out/warn.log") == 1 ]] || fail "expected exactly one warning"
# Ordinary programs run under the preload (no large allocation: the allocator is never created).
LD_PRELOAD=$so ls / > /dev/null
LD_PRELOAD=$so sh -c 'echo ok | sort | uniq' > /dev/null

step "fallow's threads never keep a process alive (its first thread leaves by pthread_exit, or a thread forks)"
# Each case fails by `timeout` (or the parent's 8 s wait) if fallow's workers outlive the program.
gcc -O2 -Wall -Werror -o "$out/last_thread_test" tests/c/last_thread_test.c -lpthread
gcc -O2 -Wall -Werror -DWITH_CAPI -o "$out/last_thread_capi" tests/c/last_thread_test.c $(pkg-config --cflags --libs fallow) -lpthread
gcc -O2 -Wall -Werror -DWITH_CAPI -o "$out/last_thread_capi_static" tests/c/last_thread_test.c -Iinclude target/release/libfallow.a -lpthread -ldl -lm
last_thread() { # last_thread NAME ENV... -- CMD...: the case must end by itself, with 0, its late thread's line flushed
    local name=$1 log=$out/last_thread.log; shift
    local status=0
    timeout 30 env "$@" > "$log" 2>&1 || status=$?
    ((status == 0)) || { cat "$log"; fail "$name: status $status"; }
    grep -q '^thread done$' "$log" || { cat "$log"; fail "$name: the last thread's output was not flushed"; }
    echo "ok $name"
}
for small in 0 1; do
    for case in main_exits fork_in_thread; do
        last_thread "preload $case (FALLOW_SMALL=$small)" FALLOW_SMALL=$small LD_PRELOAD=$so "$out/last_thread_test" $case
    done
done
for case in main_exits fork_in_thread; do
    last_thread "C API $case" "$out/last_thread_capi" $case
    last_thread "C API static $case" "$out/last_thread_capi_static" $case
done

step "malloc_trim, mallinfo2, mallinfo and malloc_stats see fallow's heap too (small objects off and on)"
# glibc's see only glibc's heap: under a preload without them every check fails but the trim of
# small objects with FALLOW_SMALL=0 (glibc's heap holds them, and glibc's trim gives them back).
# The long delay keeps the reporter from giving the freed blocks back before the trim does.
gcc -O2 -Wall -Werror -fno-builtin -o "$out/heap_info_test" tests/c/heap_info_test.c
for small in 0 1; do
    FALLOW_REPORT_DELAY_MS=600000 FALLOW_SMALL=$small LD_PRELOAD=$so "$out/heap_info_test" || fail "heap_info_test with FALLOW_SMALL=$small"
done

step "redis-server (links jemalloc, asks malloc_usable_size) under the preload"
tests/preload/redis_check.sh "$so" "$out/redis"

if [[ ${SKIP_NUMPY:-0} == 1 ]]; then
    echo "SKIP_NUMPY=1: numpy part skipped"
    exit 0
fi

step "numpy in .venv"
# meson and ninja: numpy's test_mem_policy and test_array_interface build small C extensions.
if [[ ! -x .venv/bin/meson ]] || ! .venv/bin/python -c 'import numpy, pytest, hypothesis' 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install -q numpy pytest hypothesis meson ninja
fi
.venv/bin/python -c 'import numpy; print("numpy", numpy.__version__)'

step "numpy workload with FALLOW_STATS=1 (zeroing skipped)"
LD_PRELOAD=$so FALLOW_STATS=1 .venv/bin/python tests/preload/numpy_zeros.py 2> "$out/numpy_zeros.err"
cat "$out/numpy_zeros.err"
skipped=$(sed -n 's/.*zero_skipped_bytes: *\([0-9.]*\) MiB.*/\1/p' "$out/numpy_zeros.err" | head -1)
allocs=$(sed -n 's/.*alloc_calls: *\([0-9]*\).*/\1/p' "$out/numpy_zeros.err" | head -1)
[[ -n $skipped && -n $allocs ]] || fail "no statistics printed at exit"
(( allocs >= 80 )) || fail "fallow served only $allocs allocations"
awk -v s="$skipped" 'BEGIN { exit !(s >= 64) }' || fail "zeroing skipped for only $skipped MiB"

# The part of numpy._core that fits the time budget here (about 2 minutes per run on a busy
# 2-core machine; all of numpy._core takes about 7): the array object, numeric functions and
# indexing, numpy's memory-handler policy. scripts/numpy-full-suite.sh runs all of numpy._core and the whole suite.
step "numpy._core tests without and with the preload (same outcome per test)"
tests/preload/numpy_core.sh "$root/.venv" "$so" "$out/numpy" \
    numpy._core.tests.test_multiarray numpy._core.tests.test_numeric numpy._core.tests.test_item_selection \
    numpy._core.tests.test_mem_policy numpy._core.tests.test_array_interface

echo
echo "test-capi: all passed"

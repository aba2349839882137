#!/usr/bin/env bash
# Debian's redis-server links jemalloc and asks malloc_usable_size about its pointers: run it under
# the preload (threshold 64 KiB so that its large strings come from fallow), store, grow (APPEND:
# realloc), read back and measure (MEMORY USAGE: malloc_usable_size) 1-8 MiB values, then shut it
# down cleanly. Installs redis-server when missing, as a program only: its package would start
# a system service and enable it at boot, which this test neither needs nor leaves behind (a
# policy-rc.d refuses the start during the install, and the unit is disabled after it); the test
# starts its own server on a random port and stops it.
#   tests/preload/redis_check.sh PRELOAD_SO OUTDIR
set -euo pipefail
so=$1 out=$2
mkdir -p "$out"
if ! command -v redis-server >/dev/null; then
    policy=/usr/sbin/policy-rc.d
    ours=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# Written by fallow tests/preload/redis_check.sh for one apt-get run.\nexit 101\n' > "$policy"
        chmod 755 "$policy"
        ours=1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null || { ((ours)) && rm -f "$policy"; exit 1; }
    ((ours)) && rm -f "$policy"
    if command -v systemctl >/dev/null; then
        systemctl disable redis-server >/dev/null 2>&1 || true
        systemctl stop redis-server >/dev/null 2>&1 || true
    elif command -v update-rc.d >/dev/null; then
        update-rc.d redis-server disable >/dev/null 2>&1 || true
    fi
    echo "redis-server installed; its system service is not enabled nor running"
fi
port=$((20000 + RANDOM % 20000))
LD_PRELOAD=$so FALLOW_THRESHOLD=64k FALLOW_STATS=1 redis-server --port "$port" --save "" --appendonly no \
    --daemonize no --dir "$out" > "$out/redis.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 50); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done
head -c $((1 << 20)) /dev/urandom | base64 -w0 > "$out/value"
for i in 1 2 3 4; do cli -x set "k$i" < "$out/value" > /dev/null; done
for i in 1 2 3 4; do for _ in 1 2 3 4 5; do cli -x append "k$i" < "$out/value" > /dev/null; done; done
want=$(( $(stat -c %s "$out/value") * 6 ))
for i in 1 2 3 4; do
    [[ $(cli strlen "k$i") == "$want" ]] || { echo "FAIL redis: strlen k$i"; exit 1; }
    usage=$(cli memory usage "k$i")
    (( usage >= want )) || { echo "FAIL redis: memory usage $usage < $want"; exit 1; }
done
[[ $(cli getrange k3 0 99) == "$(head -c 100 "$out/value")" ]] || { echo "FAIL redis: prefix"; exit 1; }
cli del k1 k2 > /dev/null
used=$(cli info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p' | tr -d '\r')
cli shutdown nosave > /dev/null 2>&1 || true
wait $pid; rc=$?
trap - EXIT
grep -q "fallow: free()\|fallow: realloc()\|fallow: malloc_usable_size()" "$out/redis.log" && { cat "$out/redis.log"; echo "FAIL redis: fallow error"; exit 1; }
allocs=$(sed -n 's/.*alloc_calls: *\([0-9]*\).*/\1/p' "$out/redis.log")
[[ $rc == 0 && -n $allocs && $allocs -gt 0 ]] || { tail "$out/redis.log"; echo "FAIL redis: exit $rc, fallow allocations '${allocs}'"; exit 1; }
echo "ok redis-server under the preload: $allocs fallow allocations, used_memory $used after deleting 2 of 4 keys"

#!/usr/bin/env bash
# Smoke test of the `fallow` benchmark command (crates/fallow-bench): every experiment once at a
# tiny size (exit beside one CPU hog, so that a slow exit cannot stretch it; pressure with a cgroup
# where the machine allows one and with RSS readings), checking that the JSON record has its fields
# for every peer; bad arguments give a clear error and a non-zero exit,
# never a panic; `fallow demo --tiny` writes its JSON and PNG files. No timing is asserted. Run
# from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
if ! need python3 || ! need make || ! need cc; then
    if [ "$(id -u)" = 0 ] && need apt-get; then
        apt-get update -qq && apt-get install -y -qq python3 make gcc >/dev/null
    else
        echo "test-bench: python3, make and a C compiler are needed" >&2
        exit 1
    fi
fi

cargo build --release -q -p fallow-bench
cargo test --release -q -p fallow-bench
BIN=target/release/fallow
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PEERS="glibc,jemalloc,mimalloc,mmap,fallow,fallow-delay,fallow-nozero,fallow-noreport,fallow-noworkers"

run() { # name, experiment, extra args...
    local name=$1 e=$2; shift 2
    echo "test-bench: $name"
    "$BIN" bench "$e" --rounds 1 --allocators "$PEERS" --json "$OUT/$name.json" --plot "$OUT/$name.png" "$@" >"$OUT/$name.txt"
}
run pin pin --size 4MiB --idle-ms 20
run pin-lock pin --size 4MiB --idle-ms 0 --lock
run pin-thp pin --size 4MiB --idle-ms 0 --thp
run density density --size 8MiB --guests 2 --idle-ms 50
run density-rss density --size 8MiB --guests 2 --idle-ms 50 --enforce rss
run scale scale --size 16KiB --threads 2 --count 200
run stream stream --size 2MiB --count 2
run interference interference --size 1MiB
run realloc realloc --size 4MiB
run reuse reuse --sizes 64KiB,1MiB --threads 2 --duration-ms 20
run exit exit --size 8MiB --hogs 1
run pressure pressure --size 8MiB --guests 2 --count 2 --idle-ms 20
run pressure-rss pressure --size 8MiB --guests 2 --count 2 --idle-ms 20 --enforce rss

python3 - "$OUT" "$PEERS" <<'PY'
import json, os, sys
out, peers = sys.argv[1], sys.argv[2].split(",")
common = ["allocator", "variant", "median_ms", "min_ms", "max_ms", "cpu_ms"]
fields = {
    "pin": ["ratio_vs_glibc"],
    "pin-lock": ["ratio_vs_glibc"],
    "pin-thp": ["ratio_vs_glibc"],
    "density": ["guests_fit", "settled_rss_mib", "settle_ms", "memhog_ms", "enforcement"],
    "density-rss": ["guests_fit", "settled_rss_mib", "settle_ms", "memhog_ms", "enforcement"],
    "scale": ["threads", "ns_per_pair", "pairs_per_sec"],
    "stream": ["gib_per_s", "memset_gib_per_s"],
    "interference": ["foreground_slowdown"],
    "realloc": ["moves"],
    "reuse": ["size", "mode", "threads", "calls_per_sec", "ratio_vs_glibc", "ratio_vs_best", "cpus_used", "calls"],
    "exit": ["way", "hogs", "exit_ms", "lifetime_ms", "ratio_vs_glibc"],
    "pressure": ["guests", "guests_killed", "guests_failed", "slots", "slots_over_budget", "peak_rss_mib",
                 "mean_rss_mib", "page_faults", "work_ms", "enforcement", "rss_timeline"],
    "pressure-rss": ["guests", "guests_killed", "guests_failed", "slots", "slots_over_budget", "peak_rss_mib",
                     "mean_rss_mib", "page_faults", "work_ms", "enforcement", "rss_timeline"],
}
bad = []
for e, extra in fields.items():
    d = json.load(open(os.path.join(out, e + ".json")))
    for k in ["experiment", "params", "machine", "results"]:
        if k not in d:
            bad.append(f"{e}: no '{k}'")
    if d.get("experiment") != e.split("-")[0]:
        bad.append(f"{e}: experiment is {d.get('experiment')!r}")
    seen = {r.get("peer") for r in d["results"]}
    for p in peers:
        if p not in seen:
            bad.append(f"{e}: no result for {p}")
    for r in d["results"]:
        for k in common + extra:
            if k not in r:
                bad.append(f"{e}/{r.get('peer')}: no '{k}'")
        for k in ["median_ms", "cpu_ms"]:
            if not isinstance(r.get(k), (int, float)):
                bad.append(f"{e}/{r.get('peer')}: {k} is {r.get(k)!r}")
    if e == "density-rss" and any(r["enforcement"] != "rss" for r in d["results"]):
        bad.append("density-rss: enforcement is not rss")
    if e == "scale" and {r["threads"] for r in d["results"]} != {1, 2}:
        bad.append("scale: threads are not 1 and 2")
    if e == "reuse":
        got = {(r["peer"], r["size"], r["mode"], r["threads"]) for r in d["results"]}
        want = {(p, s, m, t) for p in peers for s in ["64KiB", "1MiB"] for m in ["malloc", "calloc"] for t in [1, 2]}
        if got != want:
            bad.append(f"reuse: rows are not every peer x size x mode x threads: {sorted(want - got)}")
        if any(not r["calls"] > 0 for r in d["results"]):
            bad.append("reuse: a measurement made no calls")
    if e == "exit":
        got = {(r["peer"], r["way"]) for r in d["results"]}
        if got != {(p, w) for p in peers for w in ["return", "_exit", "signal"]}:
            bad.append("exit: rows are not every peer x way")
    if e.startswith("density"):
        for r in d["results"]:
            if len(r["settled_rss_mib"]) != len(r["settle_ms"]) or not (0 <= r["guests_fit"] <= 2):
                bad.append(f"density/{r['peer']}: inconsistent guest records")
    if e.startswith("pressure"):
        for r in d["results"]:
            who = f"{e}/{r['peer']}"
            if r["guests"] != 2 or r["guests_failed"] != 0:
                bad.append(f"{who}: {r['guests']} guests, {r['guests_failed']} failed")
            # Every living guest takes its 2 turns; a killed one takes fewer.
            killed = r["guests_killed"] or 0
            if not (4 - 2 * killed <= r["slots"] <= 4) or not (0 <= killed <= 2):
                bad.append(f"{who}: {r['slots']} turns with {killed} killed")
            t = r["rss_timeline"]
            if not t or any(len(p) != 2 for p in t) or any(b[0] < a[0] for a, b in zip(t, t[1:])):
                bad.append(f"{who}: the RSS timeline is not a series of [seconds, MiB] in time order")
            # Each guest holds 1 MiB (W/8) at least once it is ready: the peak sees them all.
            if not r["peak_rss_mib"] >= 2 or not r["mean_rss_mib"] <= r["peak_rss_mib"]:
                bad.append(f"{who}: peak {r['peak_rss_mib']} MiB, mean {r['mean_rss_mib']} MiB")
            if not r["page_faults"] > 0:
                bad.append(f"{who}: no page faults counted")
        if e == "pressure-rss" and any(r["enforcement"] != "rss" or r["guests_killed"] is not None for r in d["results"]):
            bad.append("pressure-rss: enforcement is not rss, or guests were counted as killed")
    if not open(os.path.join(out, e + ".png"), "rb").read(8).startswith(b"\x89PNG"):
        bad.append(f"{e}: the plot is not a PNG")
if bad:
    print("test-bench: FAILED\n  " + "\n  ".join(bad))
    sys.exit(1)
PY

# Bad arguments: a clear error, exit status 2 (usage) or 1, no panic.
for args in "bench nosuch" "bench pin --size 12XB" "bench pin --allocators glibc,nosuch" "bench pin --rounds 0" \
            "bench density --size 1000" "bench reuse --sizes 1MiB,4000" "bench reuse --modes memset" \
            "bench exit --exits quit" "bench pressure --size 1000" "bench pressure --allocators fallow-late" \
            "bench pin --size 1MiB --rounds 1 --idle-ms 0 --allocators glibc --json /proc/none/x.json"; do
    set +e
    # shellcheck disable=SC2086
    "$BIN" $args >"$OUT/err.out" 2>"$OUT/err.txt"
    rc=$?
    set -e
    if [ "$rc" = 0 ] || grep -q "panicked" "$OUT/err.txt" || ! grep -qi "error" "$OUT/err.txt"; then
        echo "test-bench: FAILED: 'fallow $args' exited $rc with: $(cat "$OUT/err.txt")"
        exit 1
    fi
done

echo "test-bench: demo --tiny"
"$BIN" demo --tiny --out "$OUT/demo" >"$OUT/demo.txt"
for e in pin density scale stream interference realloc reuse pressure; do
    test -s "$OUT/demo/$e.json" && test -s "$OUT/demo/$e.png" || { echo "test-bench: FAILED: demo wrote no $e files"; exit 1; }
done
for peer in fallow-noreport fallow-delay; do
    grep -q "^$peer " "$OUT/demo.txt" || { echo "test-bench: FAILED: the demo table has no $peer row"; cat "$OUT/demo.txt"; exit 1; }
done
echo "test-bench: ok"

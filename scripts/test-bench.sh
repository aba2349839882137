#!/usr/bin/env bash
# Smoke test of the `fallow` benchmark command (crates/fallow-bench): every experiment once at a
# tiny size (exit beside one CPU hog, so that a slow exit cannot stretch it; pressure with a cgroup
# where the machine allows one and with RSS readings; large and mixed with tcmalloc too where it is
# installed; small's four shapes and burst with every peer preloaded into its children, fallow-small
# among them), checking that the JSON record has its fields for every peer; bad arguments give a clear error and a non-zero exit, never a panic; `fallow demo
# --tiny` writes its JSON and PNG files; `fallow run` on a small C program (tests/run/probe.c), its
# summary checked against the program's own /proc/self/status and getrusage, its exit status and
# death by signal passed through; `fallow compare --runs 1 -- true` has a row for every installed
# peer. No timing is asserted. Run from the repository root.
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

cargo build --release -q -p fallow-bench -p fallow-preload
cargo test --release -q -p fallow-bench
BIN=target/release/fallow
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PEERS="glibc,jemalloc,mimalloc,mmap,fallow,fallow-delay,fallow-nozero,fallow-noreport,fallow-noworkers"
# tcmalloc, a preloaded peer of the experiments that run children, where Debian's library is installed.
TCMALLOC=
for f in /usr/lib/"$(uname -m)"-linux-gnu/libtcmalloc*.so* /usr/lib64/libtcmalloc*.so* /usr/lib/libtcmalloc*.so* \
    /usr/local/lib/libtcmalloc*.so*; do
    if [ -e "$f" ]; then TCMALLOC=,tcmalloc; break; fi
done

run() { # name, experiment, extra args...
    local name=$1 e=$2; shift 2
    echo "test-bench: $name"
    "$BIN" bench "$e" --rounds 1 --allocators "${RUN_PEERS:-$PEERS}" --json "$OUT/$name.json" --plot "$OUT/$name.png" "$@" >"$OUT/$name.txt"
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
RUN_PEERS=$PEERS$TCMALLOC run large large --size 1MiB --count 30
RUN_PEERS=$PEERS$TCMALLOC run mixed mixed --size 256KiB --count 30 --threads 2
# small and burst: the peers a program can preload (Debian's libraries where installed, fallow's preload).
SMALL_PEERS=glibc,fallow,fallow-small
for p in jemalloc mimalloc tcmalloc; do
    for f in /usr/lib/"$(uname -m)"-linux-gnu/lib$p*.so* /usr/lib64/lib$p*.so* /usr/lib/lib$p*.so* /usr/local/lib/lib$p*.so*; do
        if [ -e "$f" ]; then SMALL_PEERS=$SMALL_PEERS,$p; break; fi
    done
done
RUN_PEERS=$SMALL_PEERS run small small --count 2000 --threads 2
RUN_PEERS=$SMALL_PEERS run burst burst --size 4MiB --idle-ms 400

python3 - "$OUT" "$PEERS" "$TCMALLOC" "$SMALL_PEERS" <<'PY'
import json, os, sys
out, peers, tcmalloc, small_peers = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4].split(",")
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
    "large": ["steps", "user_ms", "sys_ms", "x_glibc_wall", "x_glibc_cpu", "max_rss_mib", "rss_x_glibc",
              "minor_faults", "process_ms"],
    "mixed": ["threads", "ops", "ops_per_cpu_s", "ops_x_glibc", "ops_per_s", "user_ms", "sys_ms", "x_glibc_wall",
              "max_rss_mib", "rss_x_glibc", "minor_faults", "process_ms"],
    "small": ["shape", "threads", "ops", "ops_per_cpu_s", "ops_x_glibc", "ops_per_s", "user_ms", "sys_ms",
              "x_glibc_wall", "max_rss_mib", "rss_x_glibc", "minor_faults", "process_ms"],
    "burst": ["objects", "live_mib", "baseline_mib", "built_mib", "freed_mib", "end_mib", "end_over_live", "settle_ms",
              "build_ms", "free_ms", "idle_cpu_ms", "rss_timeline"],
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
    want = small_peers if e in ("small", "burst") else peers + (["tcmalloc"] if tcmalloc and e in ("large", "mixed") else [])
    for p in want:
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
    # A child per measurement: its peak RSS holds its live data (large: 20 buffers of at least
    # 204 KiB; mixed: 2 x 32 blocks of at least 4 KiB, every page touched), its window its work.
    if e == "large" and any(r["steps"] != 30 or not r["max_rss_mib"] >= 4 or not r["median_ms"] > 0 for r in d["results"]):
        bad.append(f"large: {[(r['peer'], r['steps'], r['max_rss_mib']) for r in d['results']]}")
    if e == "mixed" and any(r["ops"] != 60 or not r["max_rss_mib"] >= 1 or not r["ops_per_cpu_s"] > 0 for r in d["results"]):
        bad.append(f"mixed: {[(r['peer'], r['ops'], r['max_rss_mib'], r['ops_per_cpu_s']) for r in d['results']]}")
    # small: every peer x shape, the operations asked for (2 threads for server and random), the
    # objects' pages in the peak RSS; burst: the same survivors for every peer (a tenth of 4 MiB),
    # the built memory resident, a reading at the end of the frees and every 200 ms of the 400 ms idle.
    if e == "small":
        got = {(r["peer"], r["shape"]) for r in d["results"]}
        if got != {(p, s) for p in small_peers for s in ["churn", "server", "queue", "random"]}:
            bad.append(f"small: rows are not every peer x shape: {sorted(got)}")
        ops = {"churn": 2000, "server": 4000, "queue": 2000, "random": 4000}
        for r in d["results"]:
            if r["ops"] != ops[r["shape"]] or not r["max_rss_mib"] > 1 or not r["ops_per_cpu_s"] > 0:
                bad.append(f"small/{r['peer']}/{r['shape']}: {r['ops']} ops, {r['max_rss_mib']} MiB, {r['ops_per_cpu_s']} ops/CPU-s")
    if e == "burst":
        if len({r["live_mib"] for r in d["results"]}) != 1 or not 0.2 < d["results"][0]["live_mib"] < 0.6:
            bad.append(f"burst: live data {[r['live_mib'] for r in d['results']]} MiB, not one tenth of 4 MiB for all")
        for r in d["results"]:
            t = r["rss_timeline"]
            if len(t) != 4 or any(b[0] < a[0] for a, b in zip(t, t[1:])) or not r["built_mib"] >= 3.5:
                bad.append(f"burst/{r['peer']}: built {r['built_mib']} MiB, timeline {t}")
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
            "bench large --size 1000" "bench mixed --size 1000" "bench pin --size 1MiB --allocators tcmalloc" \
            "bench burst --size 1000" "bench small --allocators mmap" "bench pin --size 1MiB --allocators fallow-small" \
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

# Bad arguments that clap would answer with a usage dump, and options that do not apply to the
# experiment: one line, naming the problem.
check_one_line() { # expected text, args...
    local want=$1; shift
    set +e
    "${CHECK_BIN:-$BIN}" "$@" >"$OUT/err.out" 2>"$OUT/err.txt"
    rc=$?
    set -e
    if [ "$rc" = 0 ] || [ "$(wc -l <"$OUT/err.txt")" != 1 ] || ! grep -qF -- "$want" "$OUT/err.txt"; then
        echo "test-bench: FAILED: 'fallow $*' exited $rc with (wanted one line with '$want'):"; cat "$OUT/err.txt"
        exit 1
    fi
}
check_one_line "a size cannot be negative" bench pin --size -5
check_one_line "--hogs does not apply to the pin experiment" bench pin --hogs 2
check_one_line "--lock, --budget do not apply to the scale experiment" bench scale --lock --budget 1GiB
check_one_line "--threads does not apply to the large experiment" bench large --threads 2
check_one_line "--shapes does not apply to the burst experiment" bench burst --shapes churn
check_one_line "small takes no --size" bench small --size 1MiB
check_one_line "at least 24MiB" bench density --size 8MiB --budget 1KiB
check_one_line "cannot create the directory /proc/none" bench pin --json /proc/none/x.json
check_one_line "--threshold: FALLOW_THRESHOLD=\"100\" is below one page" run --threshold 100 -- true
check_one_line "does not exist" run --preload /nonexistent/libfallow_preload.so -- true
check_one_line "cannot start /nonexistent/program" run -- /nonexistent/program
[ "$rc" = 127 ] || { echo "test-bench: FAILED: a program not found gave $rc, not 127"; exit 1; }
# Output into a missing directory: created, one `wrote PATH` line per file.
"$BIN" bench pin --size 1MiB --rounds 1 --idle-ms 0 --allocators glibc,fallow \
    --json "$OUT/new/a/pin.json" --plot "$OUT/new/b/pin.png" >"$OUT/wrote.txt"
for f in "$OUT/new/a/pin.json" "$OUT/new/b/pin.png"; do
    test -s "$f" && grep -qxF "wrote $f" "$OUT/wrote.txt" || { echo "test-bench: FAILED: no 'wrote $f'"; cat "$OUT/wrote.txt"; exit 1; }
done

echo "test-bench: run"
cc -O2 -o "$OUT/probe" tests/run/probe.c
# The preload is looked for beside the binary, then in ../lib: a copy of the binary alone names
# both paths; in an installed layout (bin/ and lib/) it is found.
mkdir -p "$OUT/alone" "$OUT/prefix/bin" "$OUT/prefix/lib"
cp "$BIN" "$OUT/alone/fallow"
CHECK_BIN=$OUT/alone/fallow check_one_line "$OUT/alone/libfallow_preload.so and $OUT/alone/../lib/libfallow_preload.so" \
    run -- true
cp "$BIN" "$OUT/prefix/bin/fallow"
cp target/release/libfallow_preload.so "$OUT/prefix/lib/"
"$OUT/prefix/bin/fallow" run -- true 2>"$OUT/installed.txt" || { echo "test-bench: FAILED: installed layout"; cat "$OUT/installed.txt"; exit 1; }
set +e
"$BIN" run --json "$OUT/run0.json" --timeline "$OUT/run0.png" -- "$OUT/probe" "$OUT/probe0.txt" 0 20 2>"$OUT/run0.err"
rc0=$?
"$BIN" run --json "$OUT/run3.json" --threshold 1MiB --zeroing off -- "$OUT/probe" "$OUT/probe3.txt" 3 5 2>"$OUT/run3.err"
rc3=$?
"$BIN" run --json "$OUT/runk.json" -- "$OUT/probe" "$OUT/probek.txt" kill:15 5 2>"$OUT/runk.err"
rck=$?
# The allocator made by a library's constructor, before the preload's own initialisation.
cc -O2 -shared -fPIC -o "$OUT/libearly.so" tests/run/early.c
cc -O2 -o "$OUT/probe_early" tests/run/probe.c -L"$OUT" -Wl,--no-as-needed -learly -Wl,-rpath,"$OUT"
"$BIN" run --json "$OUT/rune.json" -- "$OUT/probe_early" "$OUT/probee.txt" 0 5 2>"$OUT/rune.err"
rce=$?
set -e
if [ "$rc0" != 0 ] || [ "$rc3" != 3 ] || [ "$rck" != 143 ] || [ "$rce" != 0 ]; then
    echo "test-bench: FAILED: fallow run passed the statuses through as $rc0 $rc3 $rck $rce (wanted 0 3 143 0)"
    cat "$OUT/run0.err" "$OUT/run3.err" "$OUT/runk.err" "$OUT/rune.err"
    exit 1
fi
# The status comes through even when fallow run's own stderr is closed.
set +e
"$BIN" run -- sh -c 'exit 4' 2>&-
rcc=$?
set -e
[ "$rcc" = 4 ] || { echo "test-bench: FAILED: with stderr closed fallow run exited $rcc, not 4"; exit 1; }
# A SIGTERM sent to `fallow run` goes on to the program; the summary still comes.
"$BIN" run -- sleep 60 2>"$OUT/term.err" &
fp=$!
for _ in $(seq 200); do [ -n "$(cat /proc/$fp/task/*/children 2>/dev/null)" ] && break; sleep 0.05; done
sleep 0.2
kill -TERM "$fp"
set +e
wait "$fp"
rct=$?
set -e
if [ "$rct" != 143 ] || ! grep -q "sleep 60: signal 15" "$OUT/term.err"; then
    echo "test-bench: FAILED: SIGTERM to fallow run gave $rct with:"; cat "$OUT/term.err"; exit 1
fi
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
bad = []
MiB = 1 << 20
for name, rounds, status, ending in [("0", 20, 0, "exit 0"), ("3", 5, 3, "exit 3"), ("k", 5, 143, "signal 15")]:
    r = json.load(open(os.path.join(out, f"run{name}.json")))
    own = dict(kv.split("=") for kv in open(os.path.join(out, f"probe{name}.txt")).read().split())
    own = {k: int(v) for k, v in own.items()}
    err = open(os.path.join(out, f"run{name}.err")).read()
    def check(what, ok, detail):
        if not ok:
            bad.append(f"run{name}: {what}: {detail}")
    check("status", r["status"] == status and r["ending"].startswith(ending), (r["status"], r["ending"]))
    for word in ["time: wall", "RSS: peak", "page faults:", "large allocations served", "returned to the kernel"]:
        check("summary", word in err, f"no '{word}' in:\n{err}")
    # Tolerances: the program measures itself just before it returns; what the kernel counts
    # after that (exit, the preload's final record) is small: peak and final RSS within 4 MiB
    # or 10%, faults within 10% + 300, CPU time at least the program's own (less 5 ms of clock
    # granularity) and at most 1 s more.
    near = lambda a, b: abs(a - b) <= max(4 * MiB, 0.1 * b)
    check("peak RSS vs VmHWM", near(r["peak_rss_bytes"], own["hwm_kib"] * 1024), (r["peak_rss_bytes"], own["hwm_kib"]))
    if name != "k":
        check("final RSS vs VmRSS", r["final_rss_source"] == "at exit" and near(r["final_rss_bytes"], own["rss_kib"] * 1024),
              (r["final_rss_bytes"], r["final_rss_source"], own["rss_kib"]))
    else:
        check("no final record after a signal", r["final_rss_source"] == "last sample" and "last sample" in err, r["final_rss_source"])
    check("minor faults", own["minflt"] <= r["minor_faults"] <= own["minflt"] * 1.1 + 300, (r["minor_faults"], own["minflt"]))
    own_cpu = (own["utime_us"] + own["stime_us"]) / 1000
    check("CPU time", own_cpu - 5 <= r["cpu_ms"] <= own_cpu + 1000, (r["cpu_ms"], own_cpu))
    check("wall time covers the program's 300 ms rest", r["wall_ms"] >= 300, r["wall_ms"])
    f = r["fallow"]
    # One 32 MiB block kept and `rounds` 16 MiB blocks, all calloc'ed above any threshold used.
    check("large allocations", f.get("alloc_calls") == rounds + 1, f.get("alloc_calls"))
    check("live at the end", f.get("in_use") == 32 * MiB, f.get("in_use"))
    check("threshold", f.get("threshold") == (MiB if name == "3" else 256 << 10), f.get("threshold"))
    check("pre-zeroed", r["pre_zeroed_bytes"] == max(0, f["zero_skipped"] - f["reused_reported"]), r["pre_zeroed_bytes"])
    if name == "0":
        tl = r["timeline"]
        check("timeline series", {"RSS", "free dirty", "fallow live"} <= set(tl), sorted(tl))
        check("timeline samples", len(tl.get("RSS", [])) >= 3 and len(tl.get("fallow live", [])) >= 3,
              {k: len(v) for k, v in tl.items()})
        check("timeline PNG", open(os.path.join(out, "run0.png"), "rb").read(8).startswith(b"\x89PNG"), "not a PNG")
# The allocator made before the preload's initialisation (tests/run/early.c): sampled all the same.
r = json.load(open(os.path.join(out, "rune.json")))
tl = r["timeline"]
if len(tl.get("RSS", [])) < 3 or len(tl.get("fallow live", [])) < 3:
    bad.append(f"rune: timeline samples with the allocator made by a library's constructor: { {k: len(v) for k, v in tl.items()} }")
if bad:
    print("test-bench: FAILED\n  " + "\n  ".join(bad))
    sys.exit(1)
PY

echo "test-bench: compare"
"$BIN" compare --runs 1 --json "$OUT/compare.json" --plot "$OUT/compare.png" -- true >"$OUT/compare.txt" 2>&1
python3 - "$OUT" <<'PY'
import glob, json, os, platform, sys
out = sys.argv[1]
r = json.load(open(os.path.join(out, "compare.json")))
rows = {x["peer"]: x for x in r["results"]}
arch = platform.machine()
libs = {"jemalloc": "libjemalloc.so*", "mimalloc": "libmimalloc.so*", "tcmalloc": "libtcmalloc*.so*"}
dirs = [f"/usr/lib/{arch}-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
want = {"glibc", "fallow"} | {p for p, pat in libs.items() if any(glob.glob(os.path.join(d, pat)) for d in dirs)}
bad = []
if set(rows) != want:
    bad.append(f"rows {sorted(rows)}, installed {sorted(want)}")
missing = {m["peer"] for m in r["missing"]}
if missing != set(libs) - want:
    bad.append(f"missing listed {sorted(missing)}, not installed {sorted(set(libs) - want)}")
for p, x in rows.items():
    if x["status"] != "0" or not x["wall_ms"] > 0 or not x["peak_rss_mib"] > 0:
        bad.append(f"{p}: {x}")
text = open(os.path.join(out, "compare.txt")).read()
for p in want:
    if not any(line.startswith(p + " ") for line in text.splitlines()):
        bad.append(f"no table row for {p}")
if bad:
    print("test-bench: FAILED: compare\n  " + "\n  ".join(bad) + "\n" + text)
    sys.exit(1)
PY

echo "test-bench: demo --tiny"
"$BIN" demo --tiny --out "$OUT/demo" >"$OUT/demo.txt"
for e in pin density scale stream interference realloc reuse pressure large mixed small burst; do
    test -s "$OUT/demo/$e.json" && test -s "$OUT/demo/$e.png" || { echo "test-bench: FAILED: demo wrote no $e files"; exit 1; }
done
for peer in fallow-noreport fallow-delay; do
    grep -q "^$peer " "$OUT/demo.txt" || { echo "test-bench: FAILED: the demo table has no $peer row"; cat "$OUT/demo.txt"; exit 1; }
done
echo "test-bench: ok"

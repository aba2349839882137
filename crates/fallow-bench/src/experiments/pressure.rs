//! pressure: guests that share one memory budget take turns working; between its turns a guest
//! has freed most of its memory and sleeps while the others work. The budget fits the guests'
//! live data but not their free-but-resident memory: an allocator that keeps what was freed
//! (on a clock, or for good) gets guests OOM-killed, one that gives it back when someone needs
//! it does not.
//!
//! A guest is this binary re-executed in the hidden `__pressure_guest` mode, with the peer's
//! environment (`PeerKind::guest_env`: `fallow-delay` runs with `FALLOW_MEMORY_LIMIT=off` and
//! `FALLOW_PRESSURE=off`; the others with this process's environment, `fallow` at the defaults
//! unless it sets them: `environment` in the record lists the `FALLOW_*` variables given), and
//! builds its allocator from that environment (`Peer::from_environment`). It holds K = W/8 bytes
//! for its whole life (allocated and written at start) and serves, over its stdin/stdout:
//!   "work": allocate the other W - K bytes in `--chunk` (1 MiB) blocks, write them whole, read
//!     them back (a sum), free them; answer "done <ms>";
//!   "exit" or end of input: leave.
//! The supervisor (this process) starts `--guests` (4) guests, then for `--count` (3) cycles tells
//! each living guest in turn to work, `--idle-ms` (100) apart: while one works, the others sleep
//! with their freed memory. The live data is at most W + (N-1) K; the default budget is that plus
//! half of what one sleeping neighbour freed, (W - K) / 2, so one neighbour that keeps its freed
//! memory resident is already too much; plus N times what one guest program uses beside its K,
//! measured once with a glibc probe guest started and stopped first (the cgroup's usage, or its
//! anonymous RSS, once it is ready), so that the data's budget is the same whatever the size.
//! Every peer has the same budget (what an allocator uses at start counts against it), and the
//! limit is in force before its guests start (an allocator may read it when it starts).
//! `--budget` gives the whole budget instead.
//!
//! Enforcing the budget. As root with a memory cgroup (v1 or v2, `guests::Cgroup`) all guests of a
//! peer run in one cgroup limited to the budget: a guest that does not fit is OOM-killed (which
//! one is the kernel's choice), counted in `guests_killed`, and the cycles go on with the others.
//! Otherwise nothing is killed and the supervisor's samples tell: `slots_over_budget` counts the
//! turns (a work phase and the gap after it) during which the guests' summed RSS was seen above
//! the budget. `enforcement` says which.
//!
//! Measured per peer: the summed resident set of its guests every 10 ms, anonymous memory only
//! (`/proc/PID/statm` resident less shared: the program's file pages are mapped by every guest
//! but charged once; `guests::anon_of`), its peak, mean, time over budget and the series for the
//! plot, the cgroup's peak usage and `failcnt`, the wall time of the cycles, and per guest from
//! `wait4`: CPU time (user + system, all threads: an allocator's background work is charged to
//! it) and page faults.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::guests::{anon_of, reap, thread_cpu_ms, Cgroup, GuestPipe, Reaped};
use super::timeline::{default_budget, downsample, summarize, Point, Summary};
use super::{make_peers, row, Chart, Enforce, Experiment, Lines, Options, Outcome};
use crate::measure::{fill, fmt_size, median, num, summary, Progress, Sample};
use crate::peers::{Peer, PeerKind, Setup};

/// The part of W a guest holds for its whole life.
pub fn keep_of(size: usize) -> usize {
    (size / 8).next_multiple_of(4096)
}

/// Allocate `total` bytes in `chunk`-sized blocks, writing each whole with `value`.
fn allocate(peer: &Peer, total: usize, chunk: usize, value: u8) -> Result<Vec<(*mut u8, usize)>, String> {
    let mut blocks = Vec::with_capacity(total.div_ceil(chunk));
    let mut left = total;
    while left > 0 {
        let n = left.min(chunk);
        let b = peer.alloc(n, false, false);
        if b.is_null() {
            return Err(format!("{}: a guest could not allocate {n} bytes", peer.name()));
        }
        // SAFETY: `b` is the peer's live block of `n` bytes (not null: checked above), ours alone.
        unsafe { fill(b, n, value) };
        blocks.push((b, n));
        left -= n;
    }
    Ok(blocks)
}

/// Free what `allocate` gave.
fn release(peer: &Peer, blocks: &mut Vec<(*mut u8, usize)>) {
    for (b, n) in blocks.drain(..) {
        // SAFETY: every entry is a live block of `n` bytes from `peer.alloc`, drained from the
        // vector as it is freed, so freed once and not touched afterwards.
        unsafe { peer.free(b, n) };
    }
}

/// The guest mode: hold K, serve "work" and "exit" on stdin, answer on stdout.
pub fn guest_main(kind: PeerKind, size: usize, chunk: usize, cgroup: Option<PathBuf>) -> Result<(), String> {
    if let Some(dir) = cgroup {
        std::fs::write(dir.join("cgroup.procs"), format!("{}\n", std::process::id()))
            .map_err(|e| format!("cannot join cgroup {}: {e}", dir.display()))?;
    }
    let peer = Peer::from_environment(kind, Setup { working_set: size, thp: false })?;
    let chunk = chunk.clamp(4096, size.max(4096));
    let keep = keep_of(size);
    let mut held = allocate(&peer, keep, chunk, 0x11)?;
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().ok();
    let mut turn = 0u8;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        match line.trim() {
            "work" => {
                turn = turn.wrapping_add(1);
                let t0 = Instant::now();
                let mut blocks = allocate(&peer, size.saturating_sub(keep), chunk, turn)?;
                let mut sum = 0u64;
                for &(b, n) in &blocks {
                    // SAFETY: `b` is a live block of `n` bytes, written whole by `allocate` (so
                    // initialised); nothing writes it while the slice lives.
                    let s = unsafe { core::slice::from_raw_parts(b, n) };
                    sum = s.chunks(4096).fold(sum, |a, c| a.wrapping_add(c.iter().map(|&x| x as u64).sum::<u64>()));
                }
                let want = (size.saturating_sub(keep) as u64).wrapping_mul(turn as u64);
                if sum != want {
                    return Err(format!("{}: a guest read back {sum}, wrote {want}", kind.name()));
                }
                release(&peer, &mut blocks);
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                writeln!(out, "done {ms}").map_err(|e| e.to_string())?;
                out.flush().ok();
            }
            "exit" | "" => break,
            other => return Err(format!("pressure guest: unknown command '{other}'")),
        }
    }
    release(&peer, &mut held);
    Ok(())
}

struct Guest {
    pipe: GuestPipe,
    pid: u32,
    /// Still answering (false once it died or failed to answer).
    alive: bool,
}

impl Guest {
    /// Start a guest and wait for its "ready"; one that dies first is returned dead (reaped later
    /// by its pid with `guests::reap`: its `Child` is never waited for).
    fn spawn(kind: PeerKind, o: &Options, cgroup: Option<&PathBuf>) -> Result<Guest, String> {
        let mut pipe = GuestPipe::spawn("__pressure_guest", kind, o.size, o.chunk, cgroup, Stdio::inherit())?;
        let alive = pipe.read_line().as_deref() == Some("ready");
        Ok(Guest { pid: pipe.pid(), pipe, alive })
    }
}

/// What one peer's run gave.
struct Run {
    killed: usize,
    failed: usize,
    /// Turns completed (a guest killed during its turn does not complete it).
    slots: usize,
    slots_over: usize,
    wall_ms: f64,
    cpu_ms: f64,
    /// CPU time of the surviving guests' reporting workers (read before they exit): what giving
    /// memory back cost.
    reporter_cpu_ms: f64,
    faults: u64,
    major_faults: u64,
    work_ms: Vec<f64>,
    rss: Summary,
    timeline: Vec<Point>,
    peak_usage: Option<u64>,
    failcnt: Option<u64>,
    enforcement: &'static str,
}

/// Sample the guests' summed RSS every 10 ms until `stop`; count the turns seen over budget.
fn sample(pids: &[u32], budget: usize, slot: &AtomicUsize, stop: &AtomicBool, t0: Instant) -> (Vec<Point>, usize) {
    let mut points = Vec::new();
    let mut over = 0;
    let mut last_over = usize::MAX;
    while !stop.load(Ordering::Acquire) {
        let bytes: usize = pids.iter().map(|&p| anon_of(p)).sum();
        points.push(Point { ms: t0.elapsed().as_secs_f64() * 1e3, bytes });
        let s = slot.load(Ordering::Acquire);
        if bytes > budget && s != last_over && s != 0 {
            over += 1;
            last_over = s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (points, over)
}

/// The budget: `--budget` if given, else the data's (`default_budget`) plus N times what a glibc
/// probe guest uses beside its K once it is ready (in a cgroup of its own: the cgroup's usage;
/// else its anonymous RSS).
fn budget_of(o: &Options) -> Result<usize, String> {
    if o.budget > 0 {
        return Ok(o.budget);
    }
    let cgroup = cgroup_for(o, "probe", usize::MAX >> 1)?;
    let keep = keep_of(o.size);
    let probe = Guest::spawn(PeerKind::Glibc, o, cgroup.as_ref().map(|c| &c.dir))?;
    let ready = match &cgroup {
        Some(c) => c.usage().unwrap_or(0) as usize,
        None => anon_of(probe.pid),
    };
    let (alive, pid) = (probe.alive, probe.pid);
    drop(probe);
    reap(pid, Duration::from_secs(10));
    if !alive {
        return Err("a probe guest failed to start".into());
    }
    let program = ready.saturating_sub(keep);
    Ok((default_budget(o.size, keep, o.max_guests) + o.max_guests * program).next_multiple_of(1 << 20))
}

/// The cgroup of a run, as `--enforce` says (None: enforced by RSS readings).
fn cgroup_for(o: &Options, tag: &str, limit: usize) -> Result<Option<Cgroup>, String> {
    Ok(match o.enforce {
        Enforce::Rss => None,
        Enforce::Auto => Cgroup::create("pressure", tag, limit),
        Enforce::Cgroup => Some(Cgroup::create("pressure", tag, limit).ok_or(
            "--enforce cgroup: cannot create a memory cgroup (needs root and cgroup v1 memory or v2 with the memory controller)",
        )?),
    })
}

fn run_peer(kind: PeerKind, o: &Options, budget: usize, bar: &Mutex<Progress>) -> Result<Run, String> {
    let cgroup = cgroup_for(o, kind.name(), budget)?;
    let mut guests: Vec<Guest> = Vec::new();
    let started = (|| -> Result<(), String> {
        for _ in 0..o.max_guests {
            guests.push(Guest::spawn(kind, o, cgroup.as_ref().map(|c| &c.dir))?);
        }
        Ok(())
    })();
    let pids: Vec<u32> = guests.iter().map(|g| g.pid).collect();
    let slot = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut work_ms = Vec::new();
    // Turns begun (the sampler's mark of the current turn); `work_ms` has those completed.
    let mut turns = 0;
    let t0 = Instant::now();
    let ((timeline, slots_over), wall_ms) = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| sample(&pids, budget, &slot, &stop, t0));
        if started.is_ok() {
            for _ in 0..o.count {
                for g in guests.iter_mut().filter(|g| g.alive) {
                    turns += 1;
                    slot.store(turns, Ordering::Release);
                    match g.pipe.ask("work") {
                        Some(ms) => work_ms.push(ms),
                        None => g.alive = false,
                    }
                    std::thread::sleep(Duration::from_millis(o.idle_ms));
                }
                bar.lock().unwrap().step(kind.name());
            }
        }
        let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        stop.store(true, Ordering::Release);
        (sampler.join().unwrap_or_default(), wall_ms)
    });
    let failcnt = cgroup.as_ref().and_then(|c| c.failcnt());
    let peak_usage = cgroup.as_ref().and_then(|c| c.peak().or_else(|| c.usage()));
    let enforcement = cgroup.as_ref().map(|c| c.enforcement()).unwrap_or("rss");
    let reporter_cpu_ms = guests.iter().filter(|g| g.alive).map(|g| thread_cpu_ms(g.pid, "fallow-report")).fold(0.0, |a, b| a + b);
    let mut reaped: Vec<Reaped> = Vec::new();
    for mut g in guests {
        g.pipe.say("exit");
        drop(g.pipe);
        reaped.push(reap(g.pid, Duration::from_secs(10)));
    }
    // The cgroup is removed only now that its processes are gone.
    drop(cgroup);
    started?;
    Ok(Run {
        killed: reaped.iter().filter(|r| r.killed).count(),
        failed: reaped.iter().filter(|r| r.failed).count(),
        slots: work_ms.len(),
        work_ms,
        slots_over,
        wall_ms,
        cpu_ms: reaped.iter().map(|r| r.cpu_ms).sum(),
        reporter_cpu_ms,
        faults: reaped.iter().map(|r| r.minflt + r.majflt).sum(),
        major_faults: reaped.iter().map(|r| r.majflt).sum(),
        rss: summarize(&timeline, budget),
        timeline,
        peak_usage,
        failcnt,
        enforcement,
    })
}

/// The `FALLOW_*` variables of this process, which the guests but `fallow-delay`'s run with.
fn fallow_env() -> Map<String, Value> {
    std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), Value::from(v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("FALLOW_"))
        .collect()
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let w = o.size;
    if w < 1 << 20 {
        return Err(format!("pressure needs --size of at least 1MiB per guest (got {w} bytes)"));
    }
    let keep = keep_of(w);
    let budget = budget_of(o)?;
    // The peers are built here only to check that they can be (the guests build their own).
    make_peers(&o.peers, Setup { working_set: w, thp: false })?;
    let bar = Mutex::new(Progress::new("pressure", o.rounds * o.peers.len() * o.count));
    let runs = super::guests::rounds(o, |k| run_peer(k, o, budget, &bar))?;
    bar.lock().unwrap().finish();
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let med = |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
    let mut results = Vec::new();
    let mut series = Vec::new();
    let mut enforcement = "rss";
    for (i, kind) in o.peers.iter().enumerate() {
        let rs = &runs[i];
        let last = rs.last().unwrap();
        enforcement = last.enforcement;
        let samples: Vec<Sample> = rs.iter().map(|r| Sample { wall_ms: r.wall_ms, cpu_ms: r.cpu_ms }).collect();
        let mut r = row(*kind, summary(&samples));
        let sum = |f: &dyn Fn(&Run) -> usize| rs.iter().map(f).sum::<usize>();
        r.insert("guests".into(), json!(o.max_guests * rs.len()));
        r.insert("guests_killed".into(), if enforcement == "rss" { Value::Null } else { json!(sum(&|r| r.killed)) });
        r.insert("guests_failed".into(), json!(sum(&|r| r.failed)));
        r.insert("slots".into(), json!(sum(&|r| r.slots)));
        r.insert("slots_over_budget".into(), json!(sum(&|r| r.slots_over)));
        r.insert("over_budget_ms".into(), num(med(rs, &|r| r.rss.over_ms)));
        r.insert("peak_rss_mib".into(), num(med(rs, &|r| mib(r.rss.peak as f64))));
        r.insert("mean_rss_mib".into(), num(med(rs, &|r| mib(r.rss.mean))));
        r.insert("peak_usage_mib".into(), num(med(rs, &|r| r.peak_usage.map(|u| mib(u as f64)).unwrap_or(f64::NAN))));
        r.insert("failcnt".into(), json!(last.failcnt));
        // Only fallow's guests have a reporting worker.
        let fallow = kind.fallow_variant().is_some();
        let or_null = |v: f64| if fallow { num(v) } else { Value::Null };
        r.insert("reporter_cpu_ms".into(), or_null(med(rs, &|r| r.reporter_cpu_ms)));
        r.insert("reporter_cpu_share".into(), or_null(med(rs, &|r| r.reporter_cpu_ms / r.cpu_ms.max(1e-9))));
        r.insert("page_faults".into(), num(med(rs, &|r| r.faults as f64)));
        r.insert("major_faults".into(), num(med(rs, &|r| r.major_faults as f64)));
        let work: Vec<f64> = rs.iter().flat_map(|r| r.work_ms.iter().copied()).collect();
        r.insert("work_ms".into(), num(median(&work)));
        r.insert("enforcement".into(), json!(last.enforcement));
        let points = downsample(&last.timeline, 400);
        r.insert(
            "rss_timeline".into(),
            json!(points.iter().map(|p| [num(p.ms / 1e3), num(mib(p.bytes as f64))]).collect::<Vec<_>>()),
        );
        series.push((kind.name().to_string(), points.iter().map(|p| (p.ms / 1e3, mib(p.bytes as f64))).collect()));
        results.push(r);
    }
    let bars = results
        .iter()
        .map(|r| (r["peer"].as_str().unwrap_or("?").to_string(), r["peak_rss_mib"].as_f64().unwrap_or(f64::NAN)))
        .collect();
    let title = format!(
        "pressure: {} guests of {} (keeping {}) in turns under {:.0} MiB ({enforcement})",
        o.max_guests,
        fmt_size(w),
        fmt_size(keep),
        mib(budget as f64)
    );
    Ok(Outcome {
        experiment: Experiment::Pressure,
        params: json!({
            "guest_bytes": w, "guest_human": fmt_size(w), "keep_bytes": keep, "keep_human": fmt_size(keep),
            "budget_bytes": budget, "budget_mib": num(mib(budget as f64)), "budget_given": o.budget > 0,
            "data_budget_bytes": default_budget(w, keep, o.max_guests), "live_bytes": w + (o.max_guests - 1) * keep,
            "guests": o.max_guests, "cycles": o.count, "gap_ms": o.idle_ms, "chunk": o.chunk, "rounds": o.rounds,
            "peers_in_parallel": o.parallel, "enforcement": enforcement,
            "environment": fallow_env(),
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": "median_ms: wall time of the cycles; cpu_ms: the guests' CPU time (wait4); rss: the guests' summed \
                     anonymous resident set sampled every 10 ms; guests_killed: OOM-killed (cgroup) of `guests`; \
                     slots_over_budget: turns with the summed RSS seen above the budget; reporter_cpu_ms: CPU time of the \
                     surviving guests' fallow-report threads (read before they exit), reporter_cpu_share: over cpu_ms",
        }),
        results,
        chart: Chart {
            title,
            unit: "summed RSS, MiB".into(),
            bars,
            lines: Some(Lines { x_desc: "seconds".into(), series, limit: Some(("budget".into(), mib(budget as f64))) }),
        },
    })
}

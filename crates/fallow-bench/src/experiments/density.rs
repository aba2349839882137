//! density (seed 001, "mm: page_hinting"): how many guests fit in a memory budget when each one
//! touches G bytes through the allocator under test, frees everything and stays idle.
//!
//! The seed launched 5 GB VMs on a 15 GB host, each running a program that touched 4 GB and exited
//! inside the guest; the next VM started once the previous one had settled. Here a guest is a
//! process (this binary re-executed in the hidden `__guest` mode), the budget B is 3.75 x G (the
//! seed's 15/4) and at most `--guests` (8) are started.
//!
//! State machine of one guest, driven over its stdin/stdout:
//!   Started -> (says "ready") Ready -> ("touch") Touching -> (says "done <ms>") Idle
//!   Idle -> ("touch", the memhog check) Touching;  any -> ("exit" or killed) Gone.
//! A guest touches G in `--chunk`-sized allocations (memset, as the seed's program did), then frees
//! them all and idles. While it idles the parent polls its resident set (`/proc/PID/statm`) for
//! up to `--idle-ms`: `settle_ms` is the time until it falls to within 5% of G of what it was
//! before touching (the program itself, `baseline_rss_mib`; null if it did not),
//! `settled_rss_mib` what it is at the end of the wait.
//!
//! Peers run one after another (interleaved over rounds), or with `--parallel` all at once, each
//! with its own guests and budget: the waits overlap, which is what lets `fallow demo` include
//! this experiment; guests of other peers then compete for the CPUs while touching (their
//! `cpu_ms` cannot be told apart and is null).
//!
//! Enforcing the budget. As root with a memory cgroup (v1 `memory.limit_in_bytes`, or v2
//! `memory.max`) the guests run in a fresh cgroup limited to B: the kernel reclaims what it can
//! (lazily freed pages) and kills a guest when the rest will not fit; the count stops at the first
//! kill, and `failcnt` says how often the limit was hit. Otherwise the parent refuses to start a
//! guest when the guests' resident total plus G would pass B. `enforcement` says which.
//! memhog check: the last guest still alive touches its G once more; `memhog_ms` is its time
//! (null if the guest was killed doing it).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::guests::{rss_of, Cgroup, GuestPipe};
use super::{make_peers, row, Chart, Enforce, Experiment, Options, Outcome};
use crate::measure::{children_cpu_ms, fill, fmt_size, median, num, summary, Progress, Sample};
use crate::peers::{Peer, PeerKind, Setup};

/// The guest mode: serve "touch" and "exit" on stdin, answer on stdout.
pub fn guest_main(kind: PeerKind, size: usize, chunk: usize, cgroup: Option<PathBuf>) -> Result<(), String> {
    if let Some(dir) = cgroup {
        std::fs::write(dir.join("cgroup.procs"), format!("{}\n", std::process::id()))
            .map_err(|e| format!("cannot join cgroup {}: {e}", dir.display()))?;
    }
    let peer = Peer::new(kind, Setup { working_set: size, thp: false })?;
    let chunk = chunk.max(4096).min(size.max(4096));
    let count = size.div_ceil(chunk);
    let mut blocks: Vec<*mut u8> = Vec::with_capacity(count);
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().ok();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        match line.trim() {
            "touch" => {
                let t0 = Instant::now();
                for _ in 0..count {
                    let b = peer.alloc(chunk, false, false);
                    if b.is_null() {
                        return Err(format!("{}: guest could not allocate", kind.name()));
                    }
                    // SAFETY: `b` is the peer's live block of `chunk` bytes (not null: checked above).
                    unsafe { fill(b, chunk, 0x5a) };
                    blocks.push(b);
                }
                for b in blocks.drain(..) {
                    // SAFETY: every block in `blocks` is a live block of `chunk` bytes from `peer`,
                    // drained from the vector as it is freed, so freed once.
                    unsafe { peer.free(b, chunk) };
                }
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                writeln!(out, "done {ms}").map_err(|e| e.to_string())?;
                out.flush().ok();
            }
            "exit" | "" => break,
            other => return Err(format!("guest: unknown command '{other}'")),
        }
    }
    Ok(())
}

struct Guest {
    pipe: GuestPipe,
    /// Resident bytes once started, before touching anything (the program itself).
    baseline: usize,
}

impl Guest {
    fn spawn(kind: PeerKind, o: &Options, cgroup: Option<&PathBuf>) -> Result<Guest, String> {
        let pipe = GuestPipe::spawn("__guest", kind, o.size, o.chunk, cgroup, Stdio::null())?;
        let mut g = Guest { pipe, baseline: 0 };
        match g.pipe.read_line() {
            Some(l) if l == "ready" => {
                g.baseline = g.rss();
                Ok(g)
            }
            _ => {
                g.stop();
                Err(format!("{}: a guest failed to start", kind.name()))
            }
        }
    }

    /// Touch G; the guest's own time in ms, or None if it died (killed by the OOM killer).
    fn touch(&mut self) -> Option<f64> {
        self.pipe.ask("touch")
    }

    fn alive(&mut self) -> bool {
        matches!(self.pipe.child.try_wait(), Ok(None))
    }

    fn rss(&self) -> usize {
        rss_of(self.pipe.pid())
    }

    fn stop(&mut self) {
        self.pipe.say("exit");
        let child = &mut self.pipe.child;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}

/// What one peer's run gave.
struct Run {
    guests_fit: usize,
    touch: Vec<Sample>,
    settled_rss_mib: Vec<f64>,
    settle_ms: Vec<Option<f64>>,
    baseline_rss_mib: Vec<f64>,
    memhog_ms: Option<f64>,
    enforcement: &'static str,
    failcnt: Option<u64>,
    peak_usage_mib: Option<f64>,
    cpu_ms: f64,
}

fn run_peer(kind: PeerKind, o: &Options, budget: usize, bar: &Mutex<Progress>) -> Result<Run, String> {
    let g = o.size;
    let cgroup = match o.enforce {
        Enforce::Rss => None,
        Enforce::Auto => Cgroup::create("density", kind.name(), budget),
        Enforce::Cgroup => Some(Cgroup::create("density", kind.name(), budget).ok_or(
            "--enforce cgroup: cannot create a memory cgroup (needs root and cgroup v1 memory or v2 with the memory controller)",
        )?),
    };
    let mut guests: Vec<Guest> = Vec::new();
    let mut run = Run {
        guests_fit: 0,
        touch: Vec::new(),
        settled_rss_mib: Vec::new(),
        settle_ms: Vec::new(),
        baseline_rss_mib: Vec::new(),
        memhog_ms: None,
        enforcement: cgroup.as_ref().map(|c| c.enforcement()).unwrap_or("rss"),
        failcnt: None,
        peak_usage_mib: None,
        cpu_ms: 0.0,
    };
    let cpu0 = children_cpu_ms();
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let mut peak = 0u64;
    let result = (|| -> Result<(), String> {
        for _ in 0..o.max_guests {
            if cgroup.is_none() {
                let resident: usize = guests.iter().map(|g| g.rss()).sum();
                if resident + g > budget {
                    break;
                }
            }
            let mut guest = Guest::spawn(kind, o, cgroup.as_ref().map(|c| &c.dir))?;
            let touched = guest.touch();
            guests.push(guest);
            let all_alive = guests.iter_mut().all(|g| g.alive());
            bar.lock().unwrap().step(kind.name());
            let Some(ms) = touched.filter(|_| all_alive) else { break };
            run.guests_fit += 1;
            run.touch.push(Sample { wall_ms: ms, cpu_ms: 0.0 });
            // Idle: wait for the guest to give its memory back.
            let last = guests.last().unwrap();
            let t0 = Instant::now();
            let mut settled = None;
            let mut rss;
            loop {
                rss = last.rss();
                if let Some(u) = cgroup.as_ref().and_then(|c| c.usage()) {
                    peak = peak.max(u);
                }
                let waited = t0.elapsed();
                if settled.is_none() && rss.saturating_sub(last.baseline) < g / 20 {
                    settled = Some(waited.as_secs_f64() * 1e3);
                    break;
                }
                if waited >= Duration::from_millis(o.idle_ms) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            run.settle_ms.push(settled);
            run.settled_rss_mib.push(mib(rss));
            run.baseline_rss_mib.push(mib(last.baseline));
        }
        // memhog: the last guest still alive touches its memory once more.
        if let Some(k) = (0..guests.len()).rev().find(|&k| guests[k].alive()) {
            run.memhog_ms = guests[k].touch();
        }
        Ok(())
    })();
    if let Some(c) = &cgroup {
        run.failcnt = c.failcnt();
        if let Some(u) = c.usage() {
            peak = peak.max(u);
        }
        run.peak_usage_mib = Some(mib(peak as usize));
    }
    for mut guest in guests {
        guest.stop();
    }
    // RUSAGE_CHILDREN is process-wide: with peers in parallel it holds every peer's guests.
    run.cpu_ms = if o.parallel { f64::NAN } else { children_cpu_ms() - cpu0 };
    result.map(|_| run)
}

/// The smallest budget is one guest's G and this much more, for the guest process.
const MIN_BUDGET_ROOM: usize = 16 << 20;

pub fn run(o: &Options) -> Result<Outcome, String> {
    let g = o.size;
    if g < 1 << 20 {
        return Err(format!("density needs --size of at least 1MiB per guest (got {g} bytes)"));
    }
    let budget = if o.budget > 0 { o.budget } else { g / 4 * 15 };
    // One guest's G plus room for the guest process itself (this binary, a few MiB resident).
    let min_budget = g + MIN_BUDGET_ROOM;
    if budget < min_budget {
        return Err(format!(
            "density needs --budget of at least {} (one guest's --size {} plus {} for the guest process); got {}",
            fmt_size(min_budget),
            fmt_size(g),
            fmt_size(MIN_BUDGET_ROOM),
            fmt_size(budget)
        ));
    }
    // The peers are built here only to check that they can be (the guests build their own).
    make_peers(&o.peers, Setup { working_set: g, thp: false })?;
    let bar = Mutex::new(Progress::new("density", o.rounds * o.peers.len() * o.max_guests.min(4)));
    let runs = super::guests::rounds(o, |k| run_peer(k, o, budget, &bar))?;
    bar.lock().unwrap().finish();
    let mut results = Vec::new();
    let mut bars = Vec::new();
    let mut enforcement = "rss";
    for (i, kind) in o.peers.iter().enumerate() {
        let rs = &runs[i];
        let last = rs.last().unwrap();
        enforcement = last.enforcement;
        let touch: Vec<Sample> = rs.iter().flat_map(|r| r.touch.iter().copied()).collect();
        let mut s = summary(&touch);
        s.insert("cpu_ms".into(), num(median(&rs.iter().map(|r| r.cpu_ms).collect::<Vec<_>>())));
        let mut r: Map<String, Value> = row(*kind, s);
        let fit = median(&rs.iter().map(|r| r.guests_fit as f64).collect::<Vec<_>>());
        r.insert("guests_fit".into(), if fit.fract() == 0.0 { json!(fit as u64) } else { num(fit) });
        r.insert("settled_rss_mib".into(), json!(last.settled_rss_mib.iter().map(|&x| num(x)).collect::<Vec<_>>()));
        r.insert("settle_ms".into(), json!(last.settle_ms.iter().map(|x| x.map(num).unwrap_or(Value::Null)).collect::<Vec<_>>()));
        r.insert("baseline_rss_mib".into(), json!(last.baseline_rss_mib.iter().map(|&x| num(x)).collect::<Vec<_>>()));
        r.insert("memhog_ms".into(), last.memhog_ms.map(num).unwrap_or(Value::Null));
        r.insert("enforcement".into(), json!(last.enforcement));
        r.insert("failcnt".into(), json!(last.failcnt));
        r.insert("peak_usage_mib".into(), last.peak_usage_mib.map(num).unwrap_or(Value::Null));
        results.push(r);
        bars.push((kind.name().to_string(), fit));
    }
    Ok(Outcome {
        experiment: Experiment::Density,
        params: json!({
            "guest_bytes": g, "guest_human": fmt_size(g), "budget_bytes": budget, "budget_human": fmt_size(budget),
            "chunk": o.chunk, "max_guests": o.max_guests, "settle_wait_ms": o.idle_ms, "rounds": o.rounds,
            "peers_in_parallel": o.parallel,
            "enforcement": enforcement,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": "median_ms/min_ms/max_ms: a guest's time to touch G; cpu_ms: the guests' CPU time (all guests of a run)",
        }),
        results,
        chart: Chart {
            title: format!(
                "density: guests of {} that fit in {} ({enforcement}; higher is better)",
                fmt_size(g),
                fmt_size(budget)
            ),
            unit: "guests".into(),
            bars,
            lines: None,
        },
    })
}

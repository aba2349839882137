//! reuse: the hot reuse loop of a program never tuned for fallow. Each of T threads loops
//! `p = alloc(n)` (malloc, or calloc in the `calloc` mode), `memset(p, 7, n)`, `free(p)`, with n
//! drawn from [size/2, 1.375 x size] by a per-thread xorshift generator (the same seeds for every
//! peer), for `--duration-ms` of wall time; the figure is calls per second (all threads
//! together). The requests straddle `size` (at the power-of-two sizes of the sweep, a block
//! boundary: 3 in 7 of them are larger), as a real program's sizes cross an allocator's size
//! classes; `size` names the cell, the middle of the draw's range, not its largest request.
//!
//! What it shows: whether fallow's background workers hurt a program that never leaves the CPU
//! idle. Within one measurement there is no idle time at all (the loop is tight); with one thread
//! the workers have the second core to themselves, with two they compete with the program.
//! `fallow-noworkers` (both workers off) is fallow's allocation paths alone, so that
//! `ratio_vs_best` (calls per second over the better of glibc and fallow-noworkers, at the same
//! size, mode and threads) is the price, or the gain, of the workers against the best a program
//! could otherwise have. It is computed as the worse of the ratios to each of the two, each the
//! median over the rounds of one round's ratio (the peers of a round run back to back): the same
//! figure as the ratio over the better one for exact rates, without the low bias of dividing by
//! the larger of two noisy medians, and with the machine's drift between rounds cancelled.
//!
//! Every measurement gets a fresh peer (a new fallow `Allocator`; the malloc-like libraries are
//! process-wide, and give their free memory back first, `Peer::return_free_memory`, so that every
//! peer's loop runs on pages the kernel hands out anew: which physical pages back the block moves
//! the rate by several per cent), built and checked untimed just before the loop and dropped after
//! it, so that no fallow worker left from one measurement runs during the next and no peer gets
//! idle time the others do not: between measurements there is only that setup, never a sleep.
//! The peers of one size, mode and thread count run back to back, starting peer rotating per
//! round. Correctness is checked untimed before and after each measurement: a zeroed block reads
//! zero at the first and last byte of every page, the memset value persists.

use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::{alloc_failed, round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{cpu_ms, fill, fmt_size, median, num, summary, Progress, Sample, XorShift};
use crate::peers::{Peer, PeerKind, Setup, PAGE};

/// The default sweep: from the preload's threshold to 64 MiB. The smallest size draws n from
/// [256 KiB, 704 KiB], so that every request is one the preload sends to fallow (below its
/// threshold of 256 KiB it leaves requests to the C library). Smaller sizes can be asked for.
pub const DEFAULT_SIZES: [usize; 4] = [512 << 10, 1 << 20, 8 << 20, 64 << 20];

/// The goal figure: fallow default at least this fraction of the better of glibc and
/// fallow-noworkers, at every size.
const GOAL: f64 = 0.97;

/// How each block is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Malloc,
    Calloc,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Malloc => "malloc",
            Mode::Calloc => "calloc",
        }
    }
}

/// One measurement's configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    size: usize,
    mode: Mode,
    threads: usize,
}

/// The requests of the cell `size`: from `size / 2` to `1.375 x size`, so that 3 in 7 of them
/// cross `size` (a power of two in the sweep: a block or size-class boundary for most allocators).
/// The draw of [size/2, size] it replaces never crossed it, and so measured one side of every
/// boundary only.
fn request_range(size: usize) -> (usize, usize) {
    (size / 2, size + size / 8 * 3)
}

/// The loop of one thread until `deadline`; the calls done, or None if an allocation failed.
fn hot_loop(p: &Peer, c: Config, thread: usize, deadline: Instant) -> Option<u64> {
    let mut rng = XorShift::new(thread as u64);
    let (lo, hi) = request_range(c.size);
    let zero = c.mode == Mode::Calloc;
    let mut calls = 0u64;
    // At least one call, even for a loop the scheduler starts after the deadline.
    loop {
        let n = rng.range(lo, hi);
        let b = p.alloc(n, zero, false);
        if b.is_null() {
            return None;
        }
        // SAFETY: `b` is the peer's live block of `n` bytes (not null: checked above), this
        // thread's alone, freed once after the fill.
        unsafe {
            fill(b, n, 7);
            p.free(b, n);
        }
        calls += 1;
        if Instant::now() >= deadline {
            break;
        }
    }
    Some(calls)
}

/// Untimed: twice (the second time reuses what the first freed), obtain the cell's largest
/// request, check that a zeroed block reads zero at the first and last byte of every page, memset
/// it to 7, check that the value persists, free it.
fn check(p: &Peer, c: Config) -> Result<(), String> {
    let zero = c.mode == Mode::Calloc;
    let n = request_range(c.size).1;
    // SAFETY: `at` is only called below with `b` a live block of `n` bytes from `p.alloc` (read
    // before `p.free`) and `off` from `edges(page)` with `page < n`, so `off <= n - 1`.
    let at = |b: *mut u8, off: usize| unsafe { core::ptr::read_volatile(b.add(off)) };
    let edges = |off: usize| [off, (off + PAGE).min(n) - 1];
    for _ in 0..2 {
        let b = p.alloc(n, zero, false);
        if b.is_null() {
            return Err(alloc_failed(p, n));
        }
        let mut bad = None;
        for page in (0..n).step_by(PAGE) {
            for off in edges(page) {
                if zero && bad.is_none() && at(b, off) != 0 {
                    bad = Some(format!("{}: calloc'ed block of {n} bytes read {} at offset {off}", p.name(), at(b, off)));
                }
            }
        }
        // SAFETY: `b` is the peer's live block of `n` bytes (not null: checked above).
        unsafe { fill(b, n, 7) };
        for page in (0..n).step_by(PAGE) {
            for off in edges(page) {
                if bad.is_none() && at(b, off) != 7 {
                    bad = Some(format!("{}: the memset value did not persist at offset {off}", p.name()));
                }
            }
        }
        // SAFETY: `b` is the peer's live block of `n` bytes, freed once and not read after.
        unsafe { p.free(b, n) };
        if let Some(e) = bad {
            return Err(e);
        }
    }
    Ok(())
}

/// The length of one measurement of `c`: `duration`, but with several threads and blocks over
/// 16 MiB up to 4 times as long (1.2 s at 64 MiB with the default 300 ms). There two threads
/// share the memory bandwidth and do about 100 calls in 300 ms, and the ratio of two fallow
/// variants that do the same work varied from 0.85 to 1.2 between rounds (0.96-1.04 in 1 s
/// measurements): a median of 7-9 such rounds could miss the goal by noise alone.
fn duration_of(c: Config, duration: Duration) -> Duration {
    if c.threads > 1 {
        duration * (c.size >> 24).clamp(1, 4) as u32
    } else {
        duration
    }
}

/// How long each loop runs untimed before a measurement, and the seed offset it uses.
const WARMUP: Duration = Duration::from_millis(100);
const WARMUP_SEED: usize = 1000;

/// One measurement of `kind` in configuration `c`: (calls, wall and CPU time).
fn measure(kind: PeerKind, c: Config, duration: Duration) -> Result<(u64, Sample), String> {
    let peer = Peer::new(kind, Setup { working_set: request_range(c.size).1 * c.threads * 2, thp: false })?;
    peer.return_free_memory();
    check(&peer, c)?;
    // The window is the main thread's: it starts before the barrier releases the loops and ends
    // when the last has been joined, so that a loop the scheduler starts late is charged for it.
    let warmed = Barrier::new(c.threads + 1);
    let barrier = Barrier::new(c.threads + 1);
    let start: OnceLock<Instant> = OnceLock::new();
    let (calls, sample) = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..c.threads)
            .map(|t| {
                let (warmed, barrier, peer, start) = (&warmed, &barrier, &peer, &start);
                sc.spawn(move || {
                    // Untimed warm-up, the same for every peer: a fresh fallow allocator's first
                    // requests fault in new memory and fill this thread's cache, which a
                    // process-wide allocator such as glibc did in an earlier measurement.
                    let warm = hot_loop(peer, c, t + WARMUP_SEED, Instant::now() + WARMUP);
                    warmed.wait();
                    barrier.wait();
                    warm?;
                    hot_loop(peer, c, t, *start.get().unwrap() + duration)
                })
            })
            .collect();
        warmed.wait();
        let c0 = cpu_ms();
        let t0 = *start.get_or_init(Instant::now);
        barrier.wait();
        let calls: Option<Vec<u64>> = hs.into_iter().map(|h| h.join().ok().flatten()).collect();
        let sample = Sample { wall_ms: t0.elapsed().as_secs_f64() * 1e3, cpu_ms: cpu_ms() - c0 };
        (calls, sample)
    });
    let calls = calls.ok_or_else(|| alloc_failed(&peer, c.size))?;
    check(&peer, c)?;
    Ok((calls.iter().sum(), sample))
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let sizes: Vec<usize> = if o.sizes.is_empty() { DEFAULT_SIZES.to_vec() } else { o.sizes.clone() };
    if let Some(&s) = sizes.iter().find(|&&s| s < 2 * PAGE) {
        return Err(format!("reuse needs sizes of at least 8KiB (got {s} bytes)"));
    }
    let modes: Vec<Mode> = if o.modes.is_empty() { vec![Mode::Malloc, Mode::Calloc] } else { o.modes.clone() };
    let mut thread_counts = vec![1, o.threads.max(1)];
    thread_counts.dedup();
    let duration = Duration::from_millis(o.duration_ms.max(1));
    let mut configs = Vec::new();
    for &threads in &thread_counts {
        for &mode in &modes {
            for &size in &sizes {
                configs.push(Config { size, mode, threads });
            }
        }
    }
    let n = o.peers.len();
    // Per (config, peer): each round's calls per second and sample.
    let mut rates: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); n]; configs.len()];
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); n]; configs.len()];
    let mut calls_total: Vec<Vec<u64>> = vec![vec![0; n]; configs.len()];
    let mut bar = Progress::new("reuse", o.rounds * configs.len() * n);
    for round in 0..o.rounds {
        for (k, &c) in configs.iter().enumerate() {
            for i in round_order(n, round) {
                let (calls, s) = measure(o.peers[i], c, duration_of(c, duration))?;
                rates[k][i].push(calls as f64 / (s.wall_ms / 1e3));
                samples[k][i].push(s);
                calls_total[k][i] += calls;
                bar.step(o.peers[i].name());
            }
        }
    }
    bar.finish();
    let at = |kind: PeerKind| o.peers.iter().position(|&k| k == kind);
    let (glibc, noworkers, fallow) = (at(PeerKind::Glibc), at(PeerKind::FallowNoworkers), at(PeerKind::Fallow));
    let mut results = Vec::new();
    let mut bars = Vec::new();
    // The goal figure: fallow's worst ratio to the better of glibc and fallow-noworkers.
    let mut worst: Option<(f64, Config)> = None;
    for (k, &c) in configs.iter().enumerate() {
        let cps = |i: usize| median(&rates[k][i]);
        // Peer i's rate over peer j's, round by round (the two ran back to back), median over
        // the rounds: drift of the machine between rounds cancels out of each pair.
        let paired = |i: usize, j: usize| {
            let r: Vec<f64> = rates[k][i].iter().zip(&rates[k][j]).map(|(a, b)| a / b).collect();
            median(&r)
        };
        // Over the better of glibc and fallow-noworkers: the worse of the paired ratios to each.
        // (Equal to the ratio over the better one for exact figures; the ratio of medians over
        // the larger of two noisy medians would be biased low, by about half the noise.)
        let vs_best = |i: usize| [glibc, noworkers].into_iter().flatten().map(|j| paired(i, j)).reduce(f64::min);
        for (i, &kind) in o.peers.iter().enumerate() {
            let ss = &samples[k][i];
            let mut m = Map::new();
            m.insert("size".into(), json!(fmt_size(c.size)));
            m.insert("mode".into(), json!(c.mode.name()));
            m.insert("threads".into(), json!(c.threads));
            m.insert("measured_ms".into(), json!(duration_of(c, duration).as_millis() as u64));
            m.insert("calls_per_sec".into(), num(cps(i).round()));
            m.insert("ratio_vs_glibc".into(), glibc.map(|g| num(paired(i, g))).unwrap_or(Value::Null));
            m.insert("ratio_vs_best".into(), vs_best(i).map(num).unwrap_or(Value::Null));
            m.insert("us_per_call".into(), num(1e6 * c.threads as f64 / cps(i)));
            let cpus: Vec<f64> = ss.iter().map(|s| s.cpu_ms / s.wall_ms).collect();
            m.insert("cpus_used".into(), num(median(&cpus)));
            m.extend(summary(ss));
            m.insert("calls".into(), json!(calls_total[k][i]));
            m.insert("size_bytes".into(), json!(c.size));
            results.push(row(kind, m));
            if Some(i) == fallow {
                if let Some(r) = vs_best(i) {
                    if worst.is_none_or(|(w, _)| r < w) {
                        worst = Some((r, c));
                    }
                }
            }
            let value = glibc.map(|g| paired(i, g)).unwrap_or(cps(i));
            bars.push((format!("{} {} {} x{}", kind.name(), fmt_size(c.size), c.mode.name(), c.threads), value));
        }
    }
    let summary_line = match worst {
        Some((r, c)) => format!(
            "goal: fallow >= {GOAL}x the better of glibc and fallow-noworkers at every size: worst {r:.3}x at {} {} x{} ({})",
            fmt_size(c.size),
            c.mode.name(),
            c.threads,
            if r >= GOAL { "met" } else { "not met" }
        ),
        None => "goal: not computed (needs fallow and glibc or fallow-noworkers)".into(),
    };
    let (unit, what) = if glibc.is_some() { ("x glibc", "calls per second over glibc's") } else { ("calls/s", "calls per second") };
    Ok(Outcome {
        experiment: Experiment::Reuse,
        params: json!({
            "sizes": sizes.iter().map(|&s| fmt_size(s)).collect::<Vec<_>>(),
            "modes": modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
            "threads": thread_counts, "duration_ms": duration.as_millis() as u64, "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "goal": GOAL, "fallow_worst_ratio_vs_best": worst.map(|w| num(w.0)).unwrap_or(Value::Null),
            "summary": summary_line,
            "note": "n uniform in [size/2, 1.375 x size] (straddling size); calls_per_sec: all threads; ratio_vs_glibc and ratio_vs_best: medians over \
                     the rounds of the round's ratio (peers of a round run back to back); ratio_vs_best: the worse of the ratios \
                     to glibc and to fallow-noworkers at the same size, mode and threads; median_ms/min_ms/max_ms: the measurement's wall time; \
                     cpu_ms: the process's CPU time over it (background workers included); cpus_used: cpu over wall; \
                     measured_ms: the length asked of each measurement (duration_ms, longer with several threads over 16 MiB)",
        }),
        results,
        chart: Chart {
            title: format!("reuse: alloc, memset, free in a tight loop, {what} (higher is better)"),
            unit: unit.into(),
            bars,
            lines: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peer_passes_the_check_and_loops() {
        for kind in PeerKind::ALL {
            for mode in [Mode::Malloc, Mode::Calloc] {
                let c = Config { size: 64 << 10, mode, threads: 2 };
                let (calls, _) = measure(kind, c, Duration::from_millis(5)).unwrap();
                assert!(calls > 0, "{}", kind.name());
            }
        }
    }

    #[test]
    fn only_several_threads_on_large_blocks_measure_longer() {
        let d = Duration::from_millis(300);
        let c = |size: usize, threads: usize| duration_of(Config { size, mode: Mode::Calloc, threads }, d);
        assert_eq!(c(64 << 20, 1), d);
        assert_eq!(c(8 << 20, 2), d);
        assert_eq!(c(32 << 20, 2), 2 * d);
        assert_eq!(c(64 << 20, 2), 4 * d);
        assert_eq!(c(1 << 30, 2), 4 * d);
    }

    #[test]
    fn requests_straddle_the_cell_size() {
        assert_eq!(request_range(1 << 20), (512 << 10, (1 << 20) + (384 << 10)));
        let (lo, hi) = request_range(512 << 10);
        assert_eq!(lo, 256 << 10, "the sweep's smallest request is the preload's threshold");
        let mut r = XorShift::new(0);
        let draws: Vec<usize> = (0..10_000).map(|_| r.range(lo, hi)).collect();
        assert!(draws.iter().all(|n| (lo..=hi).contains(n)));
        // 3/7 of the range lies above the size (0.375 of 0.875): requests on both sides of it.
        let above = draws.iter().filter(|&&n| n > 512 << 10).count();
        assert!((4000..4600).contains(&above), "{above} of 10000 above the size");
    }
}

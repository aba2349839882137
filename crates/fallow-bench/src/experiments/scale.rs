//! scale (seeds 001 and 002: will-it-scale's page_fault1 in the hinting series, the allocator
//! fast path in the overhead series): alloc+free pairs of `--size` bytes on 1..`--threads`
//! threads at once, `--count` pairs per thread, but a thread stops early once a measurement has
//! run for `TIME_CAP` (so that a slow peer cannot stretch the demo); the first byte of each block
//! is written so that every peer hands out usable memory. `ns_per_pair` is the wall time over
//! the pairs one thread did on average (the latency a thread sees); `pairs_per_sec` is the
//! throughput of all threads together; `pairs` the total done.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{make_peers, round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fmt_size, median, num, summary, timed, Progress, Sample};
use crate::peers::{Peer, Setup, PAGE};
use fallow::Flags;

const TIME_CAP: Duration = Duration::from_millis(250);

/// Up to `count` pairs, stopping at `deadline`; the pairs done, or None if an allocation failed.
/// Each peer is called as a program calls it: the C libraries' `malloc` and `free` directly, and
/// fallow's `alloc` and `free` inlined into the loop (as a Rust program gets them), each loop
/// compiled for its peer, so that no peer pays for another's dispatch or registers.
fn pairs(p: &Peer, size: usize, count: usize, deadline: Instant) -> Option<usize> {
    if let Some(a) = p.fallow() {
        let alloc = |n| a.alloc(n, PAGE, Flags::NONE).map_or(core::ptr::null_mut(), |b| b.as_ptr());
        let free = |b: *mut u8| {
            if let Err(e) = a.free(b) {
                free_failed(p, e)
            }
        };
        return pairs_with(size, count, deadline, alloc, free);
    }
    if let Some((malloc, free)) = p.c_calls() {
        // SAFETY: `malloc` takes any size; `free` gets only blocks `malloc` returned, once each
        // (`pairs_with`).
        return pairs_with(size, count, deadline, |n| unsafe { malloc(n) } as *mut u8, |b| unsafe { free(b as _) });
    }
    // SAFETY: `free` gets only blocks of `size` bytes that `p.alloc` returned, once each.
    pairs_with(size, count, deadline, |n| p.alloc(n, false, false), |b| unsafe { p.free(b, size) })
}

#[cold]
#[inline(never)]
fn free_failed(p: &Peer, e: fallow::Error) -> ! {
    eprintln!("fallow: {}: free failed: {e}", p.name());
    std::process::exit(1);
}

/// The loop of `pairs`: `free` is called once on each non-null block `alloc` returned.
#[inline(always)]
fn pairs_with(size: usize, count: usize, deadline: Instant, alloc: impl Fn(usize) -> *mut u8, free: impl Fn(*mut u8)) -> Option<usize> {
    for i in 0..count {
        if i % 64 == 63 && Instant::now() >= deadline {
            return Some(i);
        }
        let b = alloc(size);
        if b.is_null() {
            return None;
        }
        // SAFETY: `b` is the peer's live block of `size >= 1` bytes (not null: checked above),
        // this thread's alone, freed once after the write.
        unsafe { core::ptr::write_volatile(b, i as u8) };
        free(b);
    }
    Some(count)
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let size = o.size;
    let threads_max = o.threads.max(1);
    let peers = make_peers(&o.peers, Setup { working_set: size * threads_max * 4, thp: false })?;
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); threads_max]; peers.len()];
    // Per (peer, threads): ns per pair and pairs per second of each round.
    let mut rates: Vec<Vec<Vec<(f64, f64, usize)>>> = vec![vec![Vec::new(); threads_max]; peers.len()];
    let mut bar = Progress::new("scale", o.rounds * peers.len() * threads_max);
    for round in 0..o.rounds {
        for t in 1..=threads_max {
            for i in round_order(peers.len(), round) {
                let p = &peers[i];
                let barrier = Barrier::new(t);
                let (done, s) = timed(|| {
                    std::thread::scope(|sc| {
                        let hs: Vec<_> = (0..t)
                            .map(|_| {
                                let barrier = &barrier;
                                sc.spawn(move || {
                                    barrier.wait();
                                    pairs(p, size, o.count, Instant::now() + TIME_CAP)
                                })
                            })
                            .collect();
                        hs.into_iter().map(|h| h.join().ok().flatten()).collect::<Option<Vec<usize>>>()
                    })
                });
                let Some(done) = done else {
                    return Err(super::alloc_failed(p, size));
                };
                let total: usize = done.iter().sum();
                let per_thread = total as f64 / t as f64;
                rates[i][t - 1].push((s.wall_ms * 1e6 / per_thread, total as f64 / (s.wall_ms / 1e3), total));
                samples[i][t - 1].push(s);
                bar.step(p.name());
            }
        }
    }
    bar.finish();
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        for t in 1..=threads_max {
            let ss = &samples[i][t - 1];
            let rs = &rates[i][t - 1];
            let ns_per_pair = median(&rs.iter().map(|r| r.0).collect::<Vec<_>>());
            let pairs_per_sec = median(&rs.iter().map(|r| r.1).collect::<Vec<_>>());
            let mut r = row(p.kind, summary(ss));
            r.insert("threads".into(), json!(t));
            r.insert("ns_per_pair".into(), num(ns_per_pair));
            r.insert("pairs_per_sec".into(), num(pairs_per_sec.round()));
            r.insert("pairs".into(), json!(rs.iter().map(|r| r.2).sum::<usize>()));
            results.push(r);
            bars.push((format!("{} x{t}", p.name()), ns_per_pair));
        }
    }
    Ok(Outcome {
        experiment: Experiment::Scale,
        params: json!({
            "size": size, "size_human": fmt_size(size), "threads": threads_max, "pairs_per_thread": o.count,
            "time_cap_ms": TIME_CAP.as_millis() as u64,
            "rounds": o.rounds, "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        }),
        results,
        chart: Chart {
            title: format!("scale: ns per alloc+free pair of {}, x threads (lower is better)", fmt_size(size)),
            unit: "ns/pair".into(),
            bars,
            lines: None,
        },
    })
}

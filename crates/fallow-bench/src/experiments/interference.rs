//! interference (the reviewers' objection to seed 000: background zeroing steals memory bandwidth
//! and cache from the programs that run): a memory-bound loop on one thread (passes summing a
//! 64 MiB buffer, for a fixed `WINDOW` of wall time) while a second thread, paced, frees and
//! reallocates a zeroed `--size` block through the peer and touches its pages, pausing 2 ms between
//! cycles so that there is idle time for background work. A sample is the loop's time per pass
//! (`median_ms` is per pass); `foreground_slowdown` is the median time per pass with the peer
//! churning over the median alone (measured in the same rounds, as one more turn in the
//! interleaving). fallow against fallow-nozero is the pre-zeroing on/off comparison.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{make_peers, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fmt_size, median, num, sleep_ms, summary, timed, touch_pages, Progress, Sample};
use crate::peers::{Peer, Setup};

const FOREGROUND_BYTES: usize = 64 << 20;
const WINDOW: Duration = Duration::from_millis(200);

/// Passes over `buf` until `WINDOW` has passed; the passes done.
fn foreground(buf: &[u64]) -> usize {
    let t0 = Instant::now();
    let mut passes = 0;
    let mut sum = 0u64;
    while t0.elapsed() < WINDOW {
        for &x in buf {
            sum = sum.wrapping_add(x);
        }
        sum = std::hint::black_box(sum);
        passes += 1;
    }
    passes
}

/// One foreground run with `peer` churning (None: alone). Returns the sample and the churn cycles.
fn measure(buf: &[u64], peer: Option<&Peer>, size: usize) -> Result<(Sample, usize), String> {
    let stop = AtomicBool::new(false);
    let cycles = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let s = std::thread::scope(|sc| {
        if let Some(p) = peer {
            sc.spawn(|| {
                let mut b = p.alloc(size, true, false);
                while !stop.load(Ordering::Relaxed) {
                    if b.is_null() {
                        failed.store(true, Ordering::Relaxed);
                        return;
                    }
                    // SAFETY: `b` is the peer's live block of `size` bytes (not null: checked above),
                    // this thread's alone, freed once after the touch and replaced just below.
                    unsafe {
                        touch_pages(b, size, 7);
                        p.free(b, size);
                    }
                    sleep_ms(2);
                    b = p.alloc(size, true, false);
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: `b` is null or the peer's live block of `size` bytes, freed once.
                unsafe { p.free(b, size) };
            });
            sleep_ms(20);
        }
        let (passes, s) = timed(|| foreground(buf));
        stop.store(true, Ordering::Relaxed);
        let per_pass = passes.max(1) as f64;
        Sample { wall_ms: s.wall_ms / per_pass, cpu_ms: s.cpu_ms / per_pass }
    });
    if failed.load(Ordering::Relaxed) {
        return Err(super::alloc_failed(peer.unwrap(), size));
    }
    Ok((s, cycles.load(Ordering::Relaxed)))
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let size = o.size;
    let peers = make_peers(&o.peers, Setup { working_set: size, thp: false })?;
    let buf: Vec<u64> = (0..FOREGROUND_BYTES / 8).map(|i| i as u64).collect();
    let n = peers.len() + 1; // the last turn is the foreground alone
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); n];
    let mut cycles: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut bar = Progress::new("interference", o.rounds * n);
    for round in 0..o.rounds {
        for i in super::round_order(n, round) {
            let peer = peers.get(i);
            let (s, c) = measure(&buf, peer, size)?;
            samples[i].push(s);
            cycles[i].push(c as f64);
            bar.step(peer.map(|p| p.name()).unwrap_or("alone"));
        }
    }
    bar.finish();
    let alone = median(&samples[n - 1].iter().map(|s| s.wall_ms).collect::<Vec<_>>());
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let med = median(&samples[i].iter().map(|s| s.wall_ms).collect::<Vec<_>>());
        let mut r = row(p.kind, summary(&samples[i]));
        r.insert("foreground_slowdown".into(), num(med / alone));
        r.insert("alone_ms".into(), num(alone));
        r.insert("churn_cycles".into(), num(median(&cycles[i])));
        results.push(r);
        bars.push((p.name().to_string(), med / alone));
    }
    // The pre-zeroing comparison: fallow's slowdown over fallow-nozero's, when both ran.
    let slowdown_of = |name: &str| {
        peers.iter().position(|p| p.name() == name).map(|i| {
            median(&samples[i].iter().map(|s| s.wall_ms).collect::<Vec<_>>()) / alone
        })
    };
    let zeroing_on_vs_off = match (slowdown_of("fallow"), slowdown_of("fallow-nozero")) {
        (Some(on), Some(off)) => num(on / off),
        _ => serde_json::Value::Null,
    };
    Ok(Outcome {
        experiment: Experiment::Interference,
        params: json!({
            "zeroing_on_vs_off": zeroing_on_vs_off,
            "churn_size": size, "churn_human": fmt_size(size), "foreground_bytes": FOREGROUND_BYTES,
            "window_ms": WINDOW.as_millis() as u64, "times": "median_ms, min_ms, max_ms, cpu_ms and alone_ms are per pass over the foreground buffer", "alone_ms": num(alone), "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        }),
        results,
        chart: Chart {
            title: format!("interference: memory-bound loop slowdown while {} blocks churn (lower is better)", fmt_size(size)),
            unit: "x alone".into(),
            bars,
            lines: None,
        },
    })
}

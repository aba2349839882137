//! scale (seeds 001 and 002: will-it-scale's page_fault1 in the hinting series, the allocator
//! fast path in the overhead series): alloc+free pairs of `--size` bytes on 1..`--threads`
//! threads at once, `--pairs` pairs per thread; the first byte of each block is written so that
//! every peer hands out usable memory. `ns_per_pair` is the wall time over the pairs one thread
//! did (the latency a thread sees); `pairs_per_sec` the throughput of all threads together.

use std::sync::Barrier;

use serde_json::json;

use super::{make_peers, round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fmt_size, median, num, summary, timed, Progress, Sample};
use crate::peers::{Peer, Setup};

fn pairs(p: &Peer, size: usize, count: usize) -> bool {
    for i in 0..count {
        let b = p.alloc(size, false, false);
        if b.is_null() {
            return false;
        }
        unsafe { core::ptr::write_volatile(b, i as u8) };
        p.free(b, size);
    }
    true
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let size = o.size;
    let threads_max = o.threads.max(1);
    let peers = make_peers(&o.peers, Setup { working_set: size * threads_max * 4, thp: false })?;
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); threads_max]; peers.len()];
    let mut bar = Progress::new("scale", o.rounds * peers.len() * threads_max);
    for round in 0..o.rounds {
        for t in 1..=threads_max {
            for i in round_order(peers.len(), round) {
                let p = &peers[i];
                let barrier = Barrier::new(t);
                let (ok, s) = timed(|| {
                    std::thread::scope(|sc| {
                        let hs: Vec<_> = (0..t)
                            .map(|_| {
                                let barrier = &barrier;
                                sc.spawn(move || {
                                    barrier.wait();
                                    pairs(p, size, o.count)
                                })
                            })
                            .collect();
                        hs.into_iter().all(|h| h.join().unwrap_or(false))
                    })
                });
                if !ok {
                    return Err(super::alloc_failed(p, size));
                }
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
            let med = median(&ss.iter().map(|s| s.wall_ms).collect::<Vec<_>>());
            let ns_per_pair = med * 1e6 / o.count as f64;
            let pairs_per_sec = (t * o.count) as f64 / (med / 1e3);
            let mut r = row(p.kind, summary(ss));
            r.insert("threads".into(), json!(t));
            r.insert("ns_per_pair".into(), num(ns_per_pair));
            r.insert("pairs_per_sec".into(), num(pairs_per_sec.round()));
            results.push(r);
            bars.push((format!("{} x{t}", p.name()), ns_per_pair));
        }
    }
    Ok(Outcome {
        experiment: Experiment::Scale,
        params: json!({
            "size": size, "size_human": fmt_size(size), "threads": threads_max, "pairs_per_thread": o.count,
            "rounds": o.rounds, "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        }),
        results,
        chart: Chart {
            title: format!("scale: ns per alloc+free pair of {}, x threads (lower is better)", fmt_size(size)),
            unit: "ns/pair".into(),
            bars,
        },
    })
}

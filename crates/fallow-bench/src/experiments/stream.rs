//! stream (seed 002, dd to tmpfs): allocate a `--size` buffer, write it whole, free it, `--count`
//! times; `gib_per_s` is the bytes written over the wall time. The ceiling is the machine's
//! `memset` bandwidth over a resident buffer of the same size, measured in every round of the same
//! run (`memset_gib_per_s`); `fraction_of_memset` is the peer's share of it.

use serde_json::json;

use super::{alloc_failed, make_peers, round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fill, fmt_size, median, memset_gib_per_s, num, summary, timed, Progress, Sample};
use crate::peers::Setup;

pub fn run(o: &Options) -> Result<Outcome, String> {
    let n = o.size;
    let count = o.count.max(1);
    let peers = make_peers(&o.peers, Setup { working_set: n, thp: false })?;
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); peers.len()];
    let mut ceiling = Vec::new();
    let mut bar = Progress::new("stream", o.rounds * (peers.len() + 1));
    for round in 0..o.rounds {
        ceiling.push(memset_gib_per_s(n, 3));
        bar.step("memset");
        for i in round_order(peers.len(), round) {
            let p = &peers[i];
            let (ok, s) = timed(|| {
                for k in 0..count {
                    let b = p.alloc(n, false, false);
                    if b.is_null() {
                        return false;
                    }
                    // SAFETY: `b` is the peer's live block of `n` bytes (not null: checked above),
                    // this thread's alone, freed once after the fill.
                    unsafe {
                        fill(b, n, k as u8);
                        p.free(b, n);
                    }
                }
                true
            });
            if !ok {
                return Err(alloc_failed(p, n));
            }
            samples[i].push(s);
            bar.step(p.name());
        }
    }
    bar.finish();
    let memset = median(&ceiling);
    let gib = (n * count) as f64 / (1u64 << 30) as f64;
    let mut results = Vec::new();
    let mut bars = vec![("memset (ceiling)".to_string(), memset)];
    for (i, p) in peers.iter().enumerate() {
        let med = median(&samples[i].iter().map(|s| s.wall_ms).collect::<Vec<_>>());
        let rate = gib / (med / 1e3);
        let mut r = row(p.kind, summary(&samples[i]));
        r.insert("gib_per_s".into(), num(rate));
        r.insert("memset_gib_per_s".into(), num(memset));
        r.insert("fraction_of_memset".into(), num(rate / memset));
        results.push(r);
        bars.push((p.name().to_string(), rate));
    }
    Ok(Outcome {
        experiment: Experiment::Stream,
        params: json!({
            "size": n, "size_human": fmt_size(n), "buffers_per_round": count, "rounds": o.rounds,
            "memset_gib_per_s": num(memset),
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        }),
        results,
        chart: Chart {
            title: format!("stream: write {} buffers {count} times (GiB/s, higher is better)", fmt_size(n)),
            unit: "GiB/s".into(),
            bars,
            lines: None,
        },
    })
}

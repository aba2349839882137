//! realloc: grow a buffer by doubling from 1 MiB to `--size`, writing each new half, then free
//! it. The malloc-like peers use their `realloc`; `mmap` maps the larger size fresh, copies and
//! unmaps; fallow grows in place (`resize_in_place`) when the pages after the block are free and
//! otherwise allocates, copies and frees. `moves` counts the steps where the buffer moved.

use serde_json::json;

use super::{alloc_failed, make_peers, round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fill, fmt_size, median, summary, timed, Progress, Sample};
use crate::peers::{Peer, Setup};

const START: usize = 1 << 20;

fn grow_all(p: &Peer, max: usize) -> Result<usize, String> {
    let mut n = START.min(max);
    let mut b = p.alloc(n, false, false);
    if b.is_null() {
        return Err(alloc_failed(p, n));
    }
    // SAFETY: `b` is the peer's live block of `n` bytes, used by this thread only.
    unsafe { fill(b, n, 1) };
    let mut moves = 0;
    while n < max {
        let next = (n * 2).min(max);
        // SAFETY: `b` is the peer's live block of `n <= next` bytes; after the grow only the block
        // returned is used, or `b` when null comes back.
        let q = unsafe { p.grow(b, n, next) };
        if q.is_null() {
            // SAFETY: the grow failed, so `b` is still the live block of `n` bytes; freed once.
            unsafe { p.free(b, n) };
            return Err(alloc_failed(p, next));
        }
        if q != b {
            moves += 1;
        }
        // The contents moved with the block.
        // SAFETY: `q` is the peer's live block of `next > n` bytes, whose first `n` were kept.
        if unsafe { *q.add(n - 1) } != 1 {
            // SAFETY: `q` is the live block of `next` bytes, freed once.
            unsafe { p.free(q, next) };
            return Err(format!("{}: realloc lost the contents", p.name()));
        }
        // SAFETY: `[q + n, q + next)` is the grown part of the live block `q`.
        unsafe { fill(q.add(n), next - n, 1) };
        b = q;
        n = next;
    }
    // SAFETY: `b` is the peer's live block of `n` bytes, freed once.
    unsafe { p.free(b, n) };
    Ok(moves)
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let max = o.size;
    let peers = make_peers(&o.peers, Setup { working_set: max * 2, thp: false })?;
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); peers.len()];
    let mut moves = vec![0usize; peers.len()];
    let mut bar = Progress::new("realloc", o.rounds * peers.len());
    for round in 0..o.rounds {
        for i in round_order(peers.len(), round) {
            let p = &peers[i];
            let (m, s) = timed(|| grow_all(p, max));
            moves[i] = m?;
            samples[i].push(s);
            bar.step(p.name());
        }
    }
    bar.finish();
    let steps = (max.max(START) / START).next_power_of_two().trailing_zeros();
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let mut r = row(p.kind, summary(&samples[i]));
        r.insert("steps".into(), json!(steps));
        r.insert("moves".into(), json!(moves[i]));
        results.push(r);
        bars.push((p.name().to_string(), median(&samples[i].iter().map(|s| s.wall_ms).collect::<Vec<_>>())));
    }
    Ok(Outcome {
        experiment: Experiment::Realloc,
        params: json!({
            "from": START, "to": max, "to_human": fmt_size(max), "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        }),
        results,
        chart: Chart { title: format!("realloc: grow 1MiB to {} by doubling (lower is better)", fmt_size(max)), unit: "ms".into(), bars, lines: None },
    })
}

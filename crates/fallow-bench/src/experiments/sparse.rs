//! sparse: a program that asks `calloc` for large zeroed buffers and uses little of each, as
//! `np.zeros(n)` tested with `.any()` or a large table filled sparsely does. Each step takes a
//! buffer of a random size in [size/4, size] (`ZERO`), reads one byte of every page (each must
//! be zero), writes one page in `WRITE_STRIDE` with a byte of the step's own, checks those and
//! frees the buffer; `--count` steps (default 40), the same sizes for every peer (one generator
//! seed per round).
//!
//! What it shows: an allocator that reuses the pages a previous buffer left (most of them never
//! written, only read) must make them read zero again. A memset writes every page and makes the
//! whole buffer resident (and costs a pass over it); glibc maps fresh pages at these sizes, so its
//! reads map the shared zero page and only the written pages count; fallow, from 32 MiB,
//! memsets only the pages `/proc/self/pagemap` shows written (docs/design.md, "Large `ZERO`
//! requests memset only written pages"). Each measurement runs in a child process of its own (`child.rs`): wall, user and
//! system time, minor faults and peak RSS are the measurement's alone.

use serde_json::json;

use super::child::{self, Usage};
use super::{alloc_failed, round_order, Chart, Experiment, Options, Outcome};
use crate::launch::human;
use crate::measure::{fmt_size, median, Progress, XorShift};
use crate::peers::{Peer, PAGE};

/// The default largest buffer (`--size`); the smallest is a quarter of it.
pub const SIZE: usize = 256 << 20;
/// The default steps (`--count`).
pub const STEPS: usize = 40;
/// One page in this many is written.
const WRITE_STRIDE: usize = 64;
/// The generator's seed of round 0 (round r uses `SEED + r`).
const SEED: u64 = 7;

/// The most a peer holds at once: one buffer of the largest size.
pub fn working_set(size: usize) -> usize {
    size
}

/// The child's work: `steps` buffers of [size/4, size] from the generator of `seed`, each read
/// page by page, written one page in `WRITE_STRIDE`, checked and freed; the steps done.
pub fn workload(p: &Peer, size: usize, steps: usize, seed: u64) -> Result<u64, String> {
    let mut rng = XorShift::new(seed);
    for k in 0..steps {
        let len = rng.range(size / 4, size).max(PAGE);
        let b = p.alloc(len, true, false);
        if b.is_null() {
            return Err(alloc_failed(p, len));
        }
        let value = 1 + (k % 251) as u8;
        // SAFETY: `b` is a live block of `len` bytes from `p.alloc` (not null: checked above),
        // this thread's alone, freed once below and not used after.
        let checked = unsafe { use_sparsely(b, len, value) };
        // SAFETY: as above.
        unsafe { p.free(b, len) };
        checked.map_err(|at| format!("{}: step {k}: byte {at} of a zeroed buffer of {len} bytes is not zero", p.name()))?;
    }
    Ok(steps as u64)
}

/// Read the first byte of every page of `[b, b + len)` (each must be zero: `Err` gives the first
/// offset that is not), then write `value` at the start of one page in `WRITE_STRIDE` and read it
/// back.
///
/// # Safety
/// `b` is valid for reads and writes of `len` bytes, and nobody else uses them during the call.
unsafe fn use_sparsely(b: *mut u8, len: usize, value: u8) -> Result<(), usize> {
    for off in (0..len).step_by(PAGE) {
        // SAFETY: `off < len`: inside the caller's block.
        if unsafe { b.add(off).read_volatile() } != 0 {
            return Err(off);
        }
    }
    for off in (0..len).step_by(PAGE * WRITE_STRIDE) {
        // SAFETY: as above.
        unsafe { b.add(off).write_volatile(value) };
    }
    for off in (0..len).step_by(PAGE * WRITE_STRIDE) {
        // SAFETY: as above.
        if unsafe { b.add(off).read_volatile() } != value {
            return Err(off);
        }
    }
    Ok(())
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    if o.size < 4 * PAGE {
        return Err(format!("sparse needs --size of at least 16KiB (got {} bytes)", o.size));
    }
    let n = o.peers.len();
    let mut got: Vec<Vec<Usage>> = vec![Vec::new(); n];
    let mut bar = Progress::new("sparse", o.rounds * n);
    for round in 0..o.rounds {
        for i in round_order(n, round) {
            got[i].push(child::measure(Experiment::Sparse, o.peers[i], o, SEED + round as u64, None)?);
            bar.step(o.peers[i].name());
        }
    }
    bar.finish();
    let results = child::rows(&o.peers, &got, |_, m| {
        m.insert("steps".into(), json!(o.count));
    });
    let bars = o.peers.iter().zip(&got).map(|(k, g)| (k.name().to_string(), median(&g.iter().map(|u| u.max_rss as f64 / (1 << 20) as f64).collect::<Vec<_>>()))).collect();
    Ok(Outcome {
        experiment: Experiment::Sparse,
        params: json!({
            "size": o.size, "size_human": fmt_size(o.size), "smallest": o.size / 4,
            "steps": o.count, "write_stride_pages": WRITE_STRIDE, "seed": SEED, "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": format!("each step: a zeroed buffer of [size/4, size] bytes, every page read, one in {WRITE_STRIDE} written, \
                             then freed; the generator's seed SEED + round, the same for every peer; {}", child::NOTE),
        }),
        results,
        chart: Chart {
            title: format!(
                "sparse: {} zeroed buffers of {}-{}, one page in {WRITE_STRIDE} written, peak RSS (lower is better)",
                o.count,
                human((o.size / 4) as f64),
                human(o.size as f64)
            ),
            unit: "MiB".into(),
            bars,
            lines: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::{PeerKind, Setup};

    #[test]
    fn every_linked_peer_runs_the_workload() {
        for kind in PeerKind::ALL {
            let p = Peer::new(kind, Setup { working_set: working_set(1 << 20), thp: false }).unwrap();
            assert_eq!(workload(&p, 1 << 20, 6, SEED), Ok(6), "{}", kind.name());
        }
    }

    #[test]
    fn a_buffer_that_is_not_zero_is_caught() {
        let mut buf = vec![0u8; 8 * PAGE];
        buf[3 * PAGE] = 9;
        // SAFETY: `buf` is this test's own, `8 * PAGE` bytes long.
        assert_eq!(unsafe { use_sparsely(buf.as_mut_ptr(), buf.len(), 5) }, Err(3 * PAGE));
        buf[3 * PAGE] = 0;
        // SAFETY: as above.
        assert_eq!(unsafe { use_sparsely(buf.as_mut_ptr(), buf.len(), 5) }, Ok(()));
        assert_eq!(buf[0], 5);
    }
}

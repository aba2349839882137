//! pin (seed 000, "mm: Add PG_zero support"): the time to obtain N zeroed bytes with every page
//! touched (and, with `--lock`, `mlock`ed: the VFIO pin of VM creation) after the same amount was
//! dirtied, freed and left idle for `--idle-ms`.
//!
//! One round: every peer allocates N, dirties it and frees it; then one idle gap (during which a
//! pre-zeroing allocator can zero what was freed); then each peer in turn, timed: `calloc`-like
//! allocation of N (fallow: `ZERO | POPULATE`, plus `LOCK` with `--lock`), a write to every
//! page (and `mlock` for the malloc-like peers with `--lock`). Untimed: a check that the memory
//! read zero, then the free. `ratio_vs_glibc` is glibc's median over this peer's median (above 1:
//! faster than glibc), the seed's "w/o / w/" figure.

use fallow::Flags;
use serde_json::{json, Value};

use super::{alloc_failed, make_peers, round_order, row, Chart, Experiment, Options, Outcome};
use crate::measure::{fill, fmt_size, sleep_ms, summary, timed, num, Progress, Sample};
use crate::peers::{Peer, PeerKind, Setup, PAGE};

/// Obtain `n` zeroed bytes with every page touched; `lock` adds mlock.
fn obtain(p: &Peer, n: usize, lock: bool) -> Result<*mut u8, String> {
    let b = match p.fallow() {
        Some(a) if lock => a
            .alloc(n, PAGE, Flags::ZERO | Flags::POPULATE | Flags::LOCK)
            .map_err(|e| format!("{}: {e}", p.name()))?
            .as_ptr(),
        _ => p.alloc(n, true, true),
    };
    if b.is_null() {
        return Err(alloc_failed(p, n));
    }
    // Every page is read first (it must read zero), then written.
    let mut off = 0;
    let mut nonzero = false;
    while off < n {
        // SAFETY: `off < n`, inside the live block `b` of `n` bytes (not null: checked above).
        unsafe {
            nonzero |= core::ptr::read_volatile(b.add(off)) != 0;
            core::ptr::write_volatile(b.add(off), 1);
        }
        off += PAGE;
    }
    // SAFETY: `mlock` only pins the pages of the live block `b`; it changes no contents.
    if lock && p.fallow().is_none() && unsafe { libc::mlock(b as *const _, n) } != 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: `b` is the peer's live block of `n` bytes, freed once and not returned.
        unsafe { p.free(b, n) };
        return Err(format!("{}: mlock of {n} bytes failed: {err} (raise ulimit -l or run as root)", p.name()));
    }
    if nonzero {
        return Err(format!("{}: zeroed allocation did not read zero", p.name()));
    }
    Ok(b)
}

/// Untimed: check a few bytes that `obtain` did not write, then give the memory back.
///
/// # Safety
/// `b` is a live block of `n` bytes that `obtain` got from `p` (with `lock`), not used again.
unsafe fn release(p: &Peer, b: *mut u8, n: usize, lock: bool) -> Result<(), String> {
    let mut off = 1;
    while off < n {
        // SAFETY: `off < n`, inside the live block `b` (the contract above).
        if unsafe { core::ptr::read_volatile(b.add(off)) } != 0 {
            return Err(format!("{}: zeroed allocation had garbage at offset {off}", p.name()));
        }
        off += 1 << 20;
    }
    if lock && p.fallow().is_none() {
        // SAFETY: `munlock` only unpins the pages of the block; it changes no contents.
        unsafe { libc::munlock(b as *const _, n) };
    }
    // SAFETY: `b` is the peer's live block of `n` bytes, freed once (the contract above).
    unsafe { p.free(b, n) };
    Ok(())
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    let n = o.size;
    let peers = make_peers(&o.peers, Setup { working_set: n, thp: o.thp })?;
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); peers.len()];
    let mut bar = Progress::new("pin", o.rounds * peers.len());
    for round in 0..o.rounds {
        for p in &peers {
            let b = p.alloc(n, false, false);
            if b.is_null() {
                return Err(alloc_failed(p, n));
            }
            // SAFETY: `b` is the peer's live block of `n` bytes (not null: checked above), this
            // thread's alone, freed once after the fill.
            unsafe {
                fill(b, n, 0xa5);
                p.free(b, n);
            }
        }
        sleep_ms(o.idle_ms);
        for i in round_order(peers.len(), round) {
            let p = &peers[i];
            let (b, s) = timed(|| obtain(p, n, o.lock));
            // SAFETY: a block `obtain` just got from `p`, with `o.lock`, not used after this.
            unsafe { release(p, b?, n, o.lock)? };
            samples[i].push(s);
            bar.step(p.name());
        }
    }
    bar.finish();
    let glibc = peers.iter().position(|p| p.kind == PeerKind::Glibc);
    let median_of = |i: usize| crate::measure::median(&samples[i].iter().map(|s| s.wall_ms).collect::<Vec<_>>());
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let mut r = row(p.kind, summary(&samples[i]));
        let ratio = glibc.map(|g| median_of(g) / median_of(i));
        r.insert("ratio_vs_glibc".into(), ratio.map(num).unwrap_or(Value::Null));
        results.push(r);
        bars.push((p.name().to_string(), median_of(i)));
    }
    let what = match (o.lock, o.thp) {
        (true, true) => " (mlock, THP)",
        (true, false) => " (mlock)",
        (false, true) => " (THP)",
        _ => "",
    };
    Ok(Outcome {
        experiment: Experiment::Pin,
        params: json!({
            "size": n, "size_human": fmt_size(n), "rounds": o.rounds, "idle_ms": o.idle_ms,
            "lock": o.lock, "thp": o.thp, "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        }),
        results,
        chart: Chart {
            title: format!("pin: obtain {} zeroed, every page touched{what} (lower is better)", fmt_size(n)),
            unit: "ms".into(),
            bars,
            lines: None,
        },
    })
}

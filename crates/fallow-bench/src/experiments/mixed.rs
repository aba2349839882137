//! mixed: the shape of mimalloc-bench's rptest (rpmalloc's benchmark) with large blocks. Each of
//! `--threads` threads (default 2) keeps a working set of `LIVE` blocks of random sizes in
//! [size/64, size] (64 KiB-4 MiB at the default 4 MiB; uniform, rptest's linear distribution),
//! filled first, then `--count` times (default 10000) frees a random one and allocates a block of
//! a new random size in its place, touching every page of it (one byte per 4 KiB page, as a
//! program starts to use its memory); at the end it checks and frees its blocks. The same sizes
//! and picks for every peer (one generator seed per round, one stream per thread).
//!
//! The figure is operations (alloc+free pairs, all threads) per CPU-second of the whole process,
//! background workers included, over the measured window (the fill, the operations and the final
//! frees): what the allocator costs the machine, not only the program's threads; `ops_per_s` is
//! the same over wall time. Each measurement runs in a child process of its own (`child.rs`), so
//! that its peak RSS, faults and CPU time are its alone.

use std::sync::Barrier;

use serde_json::{json, Value};

use super::child::{self, Held, Usage, NONE};
use super::{alloc_failed, round_order, Chart, Experiment, Options, Outcome};
use crate::launch::human;
use crate::measure::{fmt_size, median, num, touch_pages, Progress, XorShift};
use crate::peers::{Peer, PeerKind, PAGE};

/// The default largest block (`--size`).
pub const SIZE: usize = 4 << 20;
/// The default operations per thread (`--count`).
pub const OPS: usize = 10_000;
/// The smallest block is the largest over this (64 KiB at 4 MiB).
const SPAN: usize = 64;
/// The blocks each thread keeps live.
const LIVE: usize = 32;
/// The generator's seed of round 0 (round r uses `SEED + r`; thread t its own stream of it).
const SEED: u64 = 7;

/// The most a peer holds at once: every thread's blocks at the largest size.
pub fn working_set(size: usize, threads: usize) -> usize {
    LIVE * size * threads.max(1)
}


/// An operation's draw: which block to replace, and the new one's size in [size/64, size].
fn draw(rng: &mut XorShift, size: usize) -> (usize, usize) {
    (rng.range(0, LIVE - 1), rng.range((size / SPAN).max(1), size))
}

/// One operation: the block in `slot`, if any, given to `free`; then a block of `len` bytes from
/// `alloc`, one byte of each page written with `value`, put in its place. `None` if `alloc`
/// failed (the slot is then empty). `free` gets only blocks `alloc` returned, once each.
fn op(slot: &mut Held, len: usize, value: u8, alloc: &mut impl FnMut(usize) -> *mut u8, free: &mut impl FnMut(Held)) -> Option<()> {
    let old = std::mem::replace(slot, NONE);
    if !old.ptr.is_null() {
        free(old);
    }
    let ptr = alloc(len);
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is a fresh live block of `len` bytes from `alloc` (not null: checked above),
    // this thread's alone.
    unsafe { touch_pages(ptr, len, value) };
    *slot = Held { ptr, len, value };
    Some(())
}

/// One thread's work: fill `LIVE` blocks, `ops` operations, then check that every live block still
/// reads its value at its first and last page, and free them. `Err` names a failure.
fn thread_work(p: &Peer, size: usize, ops: usize, rng: &mut XorShift) -> Result<(), String> {
    let mut slots = [NONE; LIVE];
    let mut alloc = |n: usize| p.alloc(n, false, false);
    // SAFETY: `op` gives `free` only blocks `alloc` (this peer) returned, with their length, once
    // each, after taking them out of their slot; the end below frees the rest the same way.
    let mut free = |b: Held| unsafe { p.free(b.ptr, b.len) };
    for i in 0..LIVE + ops {
        let (slot, n) = draw(rng, size);
        let slot = if i < LIVE { i } else { slot };
        op(&mut slots[slot], n, 1 + (i % 251) as u8, &mut alloc, &mut free).ok_or_else(|| alloc_failed(p, n))?;
    }
    let mut bad = None;
    for b in slots {
        let last = (b.len - 1) & !(PAGE - 1);
        // SAFETY: `b` is a live block of `b.len >= 1` bytes from `alloc` (every slot was filled),
        // and `last < b.len`; read before its free.
        let ends = unsafe { [b.ptr.read_volatile(), b.ptr.add(last).read_volatile()] };
        if ends != [b.value; 2] && bad.is_none() {
            bad = Some(format!("{}: a block of {} bytes reads {ends:?}, not {}", p.name(), b.len, b.value));
        }
        free(b);
    }
    bad.map_or(Ok(()), Err)
}

/// The child's work: `threads` threads started together, each `thread_work` with its own stream
/// of `seed`; the operations done (all threads).
pub fn workload(p: &Peer, size: usize, ops: usize, threads: usize, seed: u64) -> Result<u64, String> {
    let threads = threads.max(1);
    let barrier = Barrier::new(threads);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let barrier = &barrier;
                sc.spawn(move || {
                    let mut rng = XorShift::new(seed.wrapping_mul(1 << 16).wrapping_add(t));
                    barrier.wait();
                    thread_work(p, size, ops, &mut rng)
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| format!("{}: a thread panicked", p.name()))??;
        }
        Ok((ops * threads) as u64)
    })
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    if o.size < PAGE {
        return Err(format!("mixed needs --size of at least 4KiB (got {} bytes)", o.size));
    }
    let n = o.peers.len();
    let mut got: Vec<Vec<Usage>> = vec![Vec::new(); n];
    let mut bar = Progress::new("mixed", o.rounds * n);
    for round in 0..o.rounds {
        for i in round_order(n, round) {
            got[i].push(child::measure(Experiment::Mixed, o.peers[i], o, SEED + round as u64, None)?);
            bar.step(o.peers[i].name());
        }
    }
    bar.finish();
    let rate = |i: usize, per: &dyn Fn(&Usage) -> f64| median(&got[i].iter().map(|u| u.ops as f64 / (per(u) / 1e3)).collect::<Vec<_>>());
    let per_cpu = |i: usize| rate(i, &Usage::cpu_ms);
    let glibc = o.peers.iter().position(|&k| k == PeerKind::Glibc);
    let results = child::rows(&o.peers, &got, |i, m| {
        m.insert("threads".into(), json!(o.threads.max(1)));
        m.insert("ops".into(), json!(got[i].first().map_or(0, |u| u.ops)));
        m.insert("ops_per_cpu_s".into(), num(per_cpu(i).round()));
        m.insert("ops_x_glibc".into(), glibc.map(|g| num(per_cpu(i) / per_cpu(g))).unwrap_or(Value::Null));
        m.insert("ops_per_s".into(), num(rate(i, &|u| u.wall_ms).round()));
    });
    let bars = o.peers.iter().enumerate().map(|(i, k)| (k.name().to_string(), per_cpu(i))).collect();
    Ok(Outcome {
        experiment: Experiment::Mixed,
        params: json!({
            "size": o.size, "size_human": fmt_size(o.size), "smallest": (o.size / SPAN).max(1), "live_per_thread": LIVE,
            "threads": o.threads.max(1), "ops_per_thread": o.count, "seed": SEED, "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": format!("each operation: free a random live block, allocate one of [size/64, size] bytes, write a byte \
                             of each of its pages; ops_per_cpu_s: operations (all threads) over the child's user + system \
                             time in the window, median over the rounds; ops_x_glibc: that over glibc's (above 1 is better); \
                             ops_per_s: over wall time; the window includes filling the working set and freeing it; {}", child::NOTE),
        }),
        results,
        chart: Chart {
            title: format!(
                "mixed: {} threads replacing blocks of {}-{} ({LIVE} live each), operations per CPU-second (higher is better)",
                o.threads.max(1),
                human((o.size / SPAN).max(1) as f64),
                human(o.size as f64)
            ),
            unit: "ops/CPU-s".into(),
            bars,
            lines: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;
    use crate::peers::Setup;
    use std::cell::RefCell;

    #[test]
    fn draws_stay_in_range_and_reach_both_ends() {
        let mut rng = XorShift::new(SEED);
        let size = 4 << 20;
        let draws: Vec<(usize, usize)> = (0..20_000).map(|_| draw(&mut rng, size)).collect();
        assert!(draws.iter().all(|&(i, n)| i < LIVE && ((64 << 10)..=size).contains(&n)));
        assert_eq!((draws.iter().map(|d| d.0).min(), draws.iter().map(|d| d.0).max()), (Some(0), Some(LIVE - 1)));
        let tenth = size / 10;
        assert!(draws.iter().any(|d| d.1 < (64 << 10) + tenth) && draws.iter().any(|d| d.1 > size - tenth));
        // Linear: about as many in the lower half of the range as in the upper.
        let mid = ((64 << 10) + size) / 2;
        let low = draws.iter().filter(|d| d.1 < mid).count();
        assert!((9000..11000).contains(&low), "{low} of 20000 below the middle");
    }

    #[derive(Debug, PartialEq)]
    enum Event {
        Alloc(usize),
        Free(usize),
    }

    #[test]
    fn an_operation_frees_then_allocates_and_touches_every_page() {
        let p = Peer::new(PeerKind::Glibc, Setup { working_set: 1 << 20, thp: false }).unwrap();
        let log = RefCell::new(Vec::new());
        let mut alloc = |n: usize| {
            log.borrow_mut().push(Event::Alloc(n));
            // Zeroed, so that the pages `op` did not touch read 0 below.
            p.alloc(n, true, false)
        };
        let mut free = |b: Held| {
            // SAFETY: `b` is a live block of `b.len` bytes from `alloc` (zeroed, so initialised),
            // read and then freed once.
            let s = unsafe { core::slice::from_raw_parts(b.ptr, b.len) };
            let touched = s.iter().enumerate().all(|(i, &x)| x == if i % PAGE == 0 { b.value } else { 0 });
            assert!(touched, "not exactly one byte per page written");
            log.borrow_mut().push(Event::Free(b.len));
            // SAFETY: as above.
            unsafe { p.free(b.ptr, b.len) };
        };
        let mut slot = NONE;
        op(&mut slot, 3 * PAGE + 1, 9, &mut alloc, &mut free).unwrap();
        op(&mut slot, 2 * PAGE, 8, &mut alloc, &mut free).unwrap();
        assert_eq!(*log.borrow(), [Event::Alloc(3 * PAGE + 1), Event::Free(3 * PAGE + 1), Event::Alloc(2 * PAGE)]);
        assert_eq!((slot.len, slot.value), (2 * PAGE, 8));
        // A failed allocation leaves the slot empty (its block was freed first).
        assert_eq!(op(&mut slot, 1, 7, &mut |_| null_mut(), &mut free), None);
        assert_eq!(slot, NONE);
        assert_eq!(log.borrow().len(), 4);
    }

    #[test]
    fn every_linked_peer_runs_the_workload_on_two_threads() {
        for kind in PeerKind::ALL {
            let p = Peer::new(kind, Setup { working_set: working_set(256 << 10, 2), thp: false }).unwrap();
            assert_eq!(workload(&p, 256 << 10, 40, 2, SEED), Ok(80), "{}", kind.name());
        }
    }
}

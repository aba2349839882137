//! large: the shape of mimalloc-bench's malloc-large. Twenty buffers live at once; each step picks
//! one at random and replaces it with a new one of a random size in [size/5, size] (5-25 MiB at
//! the default 25 MiB), allocating the new buffer before freeing the old, as
//! `buffers[i] = std::make_unique<char[]>(n)` does, and writing the new one whole (a memset, as
//! the value-initialisation of `new char[n]()` does; here with a byte of the step's own, so that
//! the end can check that no live buffer was handed out twice). `--count` steps (default 2000),
//! the same sizes and picks for every peer (one generator seed per round); at the end the live
//! buffers are checked and freed (the destructors at the end of the C++ program).
//!
//! What it shows: how an allocator serves a program that keeps replacing multi-MiB buffers: how
//! many of the new pages are already resident and reused (user time of the memset, few faults)
//! or mapped anew (system time of the faults and of the kernel's zeroing), and how much memory it
//! holds meanwhile (peak RSS). Each measurement runs in a child process of its own (`child.rs`):
//! wall, user and system time, minor faults and peak RSS are the measurement's alone.


use serde_json::json;

use super::child::{self, Held, Usage, NONE};
use super::{alloc_failed, round_order, Chart, Experiment, Options, Outcome};
use crate::launch::human;
use crate::measure::{fill, fmt_size, median, Progress, XorShift};
use crate::peers::{Peer, PAGE};

/// The default largest buffer (`--size`); the smallest is a fifth of it.
pub const SIZE: usize = 25 << 20;
/// The default steps (`--count`), malloc-large's iterations.
pub const STEPS: usize = 2000;
/// The buffers live at once.
const BUFFERS: usize = 20;
/// The generator's seed of round 0 (round r uses `SEED + r`), malloc-large's.
const SEED: u64 = 42;

/// The most a peer holds at once: every buffer at the largest size, and the new one beside the
/// old it replaces.
pub fn working_set(size: usize) -> usize {
    (BUFFERS + 1) * size
}


/// A step's draw: which buffer to replace, and the new one's size in [size/5, size].
fn draw(rng: &mut XorShift, size: usize) -> (usize, usize) {
    (rng.range(0, BUFFERS - 1), rng.range(size / 5, size))
}

/// One step: a new buffer of `len` bytes from `alloc`, written whole with `value`, put in `slot`;
/// then the buffer it replaces, if any, given to `free`. `None` if `alloc` failed (the slot keeps
/// its buffer). `free` gets only buffers `alloc` returned, once each, and never the slot's.
fn step(
    slot: &mut Held,
    len: usize,
    value: u8,
    alloc: &mut impl FnMut(usize) -> *mut u8,
    free: &mut impl FnMut(Held),
) -> Option<()> {
    let ptr = alloc(len);
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is a fresh live block of `len` bytes from `alloc` (not null: checked above),
    // this thread's alone.
    unsafe { fill(ptr, len, value) };
    let old = std::mem::replace(slot, Held { ptr, len, value });
    if !old.ptr.is_null() {
        free(old);
    }
    Some(())
}

/// The child's work: `steps` steps over `BUFFERS` buffers of [size/5, size] from the generator of
/// `seed`, then the live buffers checked (first and last byte still their value) and freed; the
/// steps done.
pub fn workload(p: &Peer, size: usize, steps: usize, seed: u64) -> Result<u64, String> {
    let mut rng = XorShift::new(seed);
    let mut slots = [NONE; BUFFERS];
    let mut alloc = |n: usize| p.alloc(n, false, false);
    // SAFETY: `step` gives `free` only buffers `alloc` (this peer) returned, with their length,
    // once each, after taking them out of their slot; the end below frees the rest the same way.
    let mut free = |b: Held| unsafe { p.free(b.ptr, b.len) };
    for k in 0..steps {
        let (i, n) = draw(&mut rng, size);
        step(&mut slots[i], n, 1 + (k % 251) as u8, &mut alloc, &mut free).ok_or_else(|| alloc_failed(p, n))?;
    }
    let mut bad = None;
    for (i, b) in slots.into_iter().enumerate().filter(|(_, b)| !b.ptr.is_null()) {
        // SAFETY: `b` is a live buffer of `b.len >= 1` bytes from `alloc`, read before its free.
        let ends = unsafe { [b.ptr.read_volatile(), b.ptr.add(b.len - 1).read_volatile()] };
        if ends != [b.value; 2] && bad.is_none() {
            bad = Some(format!("{}: buffer {i} of {} bytes reads {ends:?}, not {}", p.name(), b.len, b.value));
        }
        free(b);
    }
    bad.map_or(Ok(steps as u64), Err)
}

pub fn run(o: &Options) -> Result<Outcome, String> {
    if o.size < PAGE {
        return Err(format!("large needs --size of at least 4KiB (got {} bytes)", o.size));
    }
    let n = o.peers.len();
    let mut got: Vec<Vec<Usage>> = vec![Vec::new(); n];
    let mut bar = Progress::new("large", o.rounds * n);
    for round in 0..o.rounds {
        for i in round_order(n, round) {
            got[i].push(child::measure(Experiment::Large, o.peers[i], o, SEED + round as u64, None)?);
            bar.step(o.peers[i].name());
        }
    }
    bar.finish();
    let results = child::rows(&o.peers, &got, |_, m| {
        m.insert("steps".into(), json!(o.count));
    });
    let bars = o.peers.iter().zip(&got).map(|(k, g)| (k.name().to_string(), median(&g.iter().map(|u| u.wall_ms).collect::<Vec<_>>()))).collect();
    Ok(Outcome {
        experiment: Experiment::Large,
        params: json!({
            "size": o.size, "size_human": fmt_size(o.size), "smallest": o.size / 5, "buffers": BUFFERS,
            "steps": o.count, "seed": SEED, "rounds": o.rounds,
            "allocators": o.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "note": format!("each step: a new buffer of [size/5, size] bytes, memset whole, then the one it replaces freed; \
                             the generator's seed SEED + round, the same for every peer; {}", child::NOTE),
        }),
        results,
        chart: Chart {
            title: format!(
                "large: {} steps replacing one of {BUFFERS} buffers of {}-{}, wall time (lower is better)",
                o.count,
                human((o.size / 5) as f64),
                human(o.size as f64)
            ),
            unit: "ms".into(),
            bars,
            lines: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;
    use crate::peers::{PeerKind, Setup};
    use std::cell::RefCell;

    #[test]
    fn draws_stay_in_range_and_reach_both_ends() {
        let mut rng = XorShift::new(SEED);
        let size = 25 << 20;
        let draws: Vec<(usize, usize)> = (0..20_000).map(|_| draw(&mut rng, size)).collect();
        assert!(draws.iter().all(|&(i, n)| i < BUFFERS && (size / 5..=size).contains(&n)));
        assert_eq!(draws.iter().map(|d| d.0).max(), Some(BUFFERS - 1));
        assert_eq!(draws.iter().map(|d| d.0).min(), Some(0));
        // Sizes cover the range: some in its lowest and its highest tenth.
        let tenth = (size - size / 5) / 10;
        assert!(draws.iter().any(|d| d.1 < size / 5 + tenth) && draws.iter().any(|d| d.1 > size - tenth));
    }

    #[derive(Debug, PartialEq)]
    enum Event {
        Alloc(usize),
        Free(usize),
    }

    #[test]
    fn a_step_allocates_and_writes_the_new_buffer_before_freeing_the_old() {
        let p = Peer::new(PeerKind::Glibc, Setup { working_set: 1 << 20, thp: false }).unwrap();
        let log = RefCell::new(Vec::new());
        let mut alloc = |n: usize| {
            log.borrow_mut().push(Event::Alloc(n));
            p.alloc(n, false, false)
        };
        let mut free = |b: Held| {
            // The buffer freed was written whole with its value.
            // SAFETY: `b` is a live buffer of `b.len` bytes from `alloc`, written whole by `step`
            // (so initialised), freed once just after the read.
            let whole = unsafe { core::slice::from_raw_parts(b.ptr, b.len) }.iter().all(|&x| x == b.value);
            assert!(whole, "the buffer was not written whole");
            log.borrow_mut().push(Event::Free(b.len));
            // SAFETY: as above: `b` came from `alloc` with this length and is freed once.
            unsafe { p.free(b.ptr, b.len) };
        };
        let mut slot = NONE;
        step(&mut slot, 3000, 5, &mut alloc, &mut free).unwrap();
        assert_eq!((slot.len, slot.value), (3000, 5));
        step(&mut slot, 7000, 6, &mut alloc, &mut free).unwrap();
        assert_eq!(*log.borrow(), [Event::Alloc(3000), Event::Alloc(7000), Event::Free(3000)]);
        assert_eq!((slot.len, slot.value), (7000, 6));
        // A failed allocation frees nothing and keeps the slot's buffer.
        let kept = slot;
        assert_eq!(step(&mut slot, 1, 7, &mut |_| null_mut(), &mut free), None);
        assert_eq!(slot, kept);
        assert_eq!(log.borrow().len(), 3);
        free(slot);
    }

    #[test]
    fn every_linked_peer_runs_the_workload() {
        for kind in PeerKind::ALL {
            let p = Peer::new(kind, Setup { working_set: working_set(64 << 10), thp: false }).unwrap();
            assert_eq!(workload(&p, 64 << 10, 60, SEED), Ok(60), "{}", kind.name());
        }
    }
}

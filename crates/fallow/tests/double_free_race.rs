//! Double frees that race: several threads free the same live block at once. At least one free
//! succeeds, every other one is reported as a double free; a free after them all is a double
//! free. While every race is caught (one success), the allocator's invariants hold, cached
//! blocks' state bytes included. Two successes (the race escaping detection, as the hit path
//! allows: docs/design.md, "Access rules") corrupt the counters and may put the block in two
//! caches: the allocator must still serve and free blocks, and the rounds go on with a new one.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};

use common::*;
use fallow::{Error, Flags};

const THREADS: usize = 3;
const ROUNDS: usize = 1500;

/// Pages per block, cycling: one page (the hit path's byte store), 2, 8 and 16 pages (wider
/// stores), and 3 and 96 pages (blocks with slack, whose free counts the slack's states).
const SIZES: [usize; 7] = [1, 2, 8, 3, 16, 1, 96];

#[test]
fn racing_double_frees() {
    let (mut round, mut escaped) = (0, 0);
    while round < ROUNDS {
        if race_until_escape(&mut round) {
            escaped += 1;
        }
    }
    eprintln!("{ROUNDS} rounds, {escaped} escaped detection");
}

/// Rounds on a new allocator from `*round` on, until `ROUNDS` or a race that escaped detection
/// (`true`).
fn race_until_escape(round: &mut usize) -> bool {
    let a = small();
    let block = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // Both sides meet twice a round: the block is published, then all frees are done.
    let barrier = Barrier::new(THREADS + 1);
    let results: Mutex<Vec<Result<(), Error>>> = Mutex::new(Vec::new());
    let mut escaped = false;
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                barrier.wait();
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let r = a.free(block.load(Ordering::Relaxed) as *mut u8);
                results.lock().unwrap().push(r);
                barrier.wait();
            });
        }
        while *round < ROUNDS && !escaped {
            let pages = SIZES[*round % SIZES.len()];
            // Another live block beside it, so that the freed one is not always merged at once.
            let keep = a.alloc(4096, 4096, Flags::NONE).unwrap();
            let p = a.alloc(pages * 4096, 4096, Flags::NONE).unwrap().as_ptr();
            block.store(p as usize, Ordering::Relaxed);
            barrier.wait();
            barrier.wait();
            let rs = std::mem::take(&mut *results.lock().unwrap());
            assert_eq!(rs.len(), THREADS);
            let double = Err(Error::DoubleFree { addr: p as usize });
            for r in &rs {
                assert!(r.is_ok() || *r == double, "round {round}, {pages} pages: {r:?}");
            }
            let ok = rs.iter().filter(|r| r.is_ok()).count();
            assert!(ok >= 1, "round {round}, {pages} pages: no free of a live block succeeded: {rs:?}");
            assert_eq!(a.free(p), double, "round {round}: free after the race");
            a.free(keep.as_ptr()).unwrap();
            escaped = ok > 1;
            if !escaped && round.is_multiple_of(10) {
                a.check_invariants().unwrap_or_else(|e| panic!("round {round}, {pages} pages: {e}"));
            }
            *round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        barrier.wait();
    });
    if !escaped {
        a.check_invariants().unwrap();
    }
    // Whatever happened, the allocator still serves and frees blocks of every size used.
    for pages in SIZES {
        let p = a.alloc(pages * 4096, 4096, Flags::NONE).unwrap();
        a.free(p.as_ptr()).unwrap();
    }
    escaped
}

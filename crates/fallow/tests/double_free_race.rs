//! Double frees that race: several threads free the same live block at once. At least one free
//! succeeds, every other one is reported as a double free; a free after them all is a double
//! free. While every race is caught (one success), the allocator's invariants hold, cached
//! blocks' state bytes included. Two successes (the race escaping detection, as the hit path
//! allows: docs/design.md, "Access rules") corrupt the counters and may put the block in two
//! caches, so the rounds stop there; the allocator must still serve and free blocks.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};

use common::*;
use fallow::{Error, Flags};

const THREADS: usize = 3;
const ROUNDS: usize = 1500;

#[test]
fn racing_double_frees() {
    let a = small();
    let block = AtomicUsize::new(0);
    let stop = AtomicUsize::new(0);
    // Both sides meet twice a round: the block is published, then all frees are done.
    let barrier = Barrier::new(THREADS + 1);
    let results: Mutex<Vec<Result<(), Error>>> = Mutex::new(Vec::new());
    // Pages per block, cycling: one page (the hit path's byte store), 2, 8 and 16 pages (wider
    // stores), and 3 and 96 pages (blocks with slack, whose free counts the slack's states).
    let sizes = [1usize, 2, 8, 3, 16, 1, 96];
    let mut escaped = 0;
    let mut rounds = 0;
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                barrier.wait();
                if stop.load(Ordering::Relaxed) != 0 {
                    return;
                }
                let r = a.free(block.load(Ordering::Relaxed) as *mut u8);
                results.lock().unwrap().push(r);
                barrier.wait();
            });
        }
        for round in 0..ROUNDS {
            rounds = round + 1;
            let pages = sizes[round % sizes.len()];
            // Another live block beside it, so that the freed one is not always merged at once.
            let keep = a.alloc(4096, 4096, Flags::NONE).unwrap();
            let p = a.alloc(pages * 4096, 4096, Flags::NONE).unwrap().as_ptr();
            block.store(p as usize, Ordering::Relaxed);
            barrier.wait();
            barrier.wait();
            let rs = std::mem::take(&mut *results.lock().unwrap());
            assert_eq!(rs.len(), THREADS);
            let ok = rs.iter().filter(|r| r.is_ok()).count();
            let double = Err(Error::DoubleFree { addr: p as usize });
            for r in &rs {
                assert!(r.is_ok() || *r == double, "round {round}, {pages} pages: {r:?}");
            }
            assert!(ok >= 1, "round {round}, {pages} pages: no free of a live block succeeded: {rs:?}");
            assert_eq!(a.free(p), double, "round {round}: free after the race");
            a.free(keep.as_ptr()).unwrap();
            if ok > 1 {
                escaped += 1;
                break;
            }
            if round % 10 == 0 {
                a.check_invariants().unwrap_or_else(|e| panic!("round {round}, {pages} pages: {e}"));
            }
        }
        stop.store(1, Ordering::Relaxed);
        barrier.wait();
    });
    if escaped == 0 {
        a.check_invariants().unwrap();
    }
    // Whatever happened, the allocator still serves and frees blocks of every size used.
    for pages in sizes {
        let p = a.alloc(pages * 4096, 4096, Flags::NONE).unwrap();
        a.free(p.as_ptr()).unwrap();
    }
    eprintln!("{rounds} rounds, {escaped} escaped detection");
}

//! Double frees that race: several threads free the same live block at once. At least one free
//! succeeds, every other one is reported as a double free; a free after them all is a double
//! free. While every race is caught (one success), the allocator's invariants hold, cached
//! blocks' state bytes included. Two successes (the race escaping detection, as the hit path
//! allows: docs/design.md, "Access rules") corrupt the counters and may put the block in two
//! caches: the allocator must still serve and free blocks, and the rounds go on with a new one.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use std::panic::AssertUnwindSafe;
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
/// (`true`). A failed check, or a panic in a freeing thread (a debug assertion), stops the
/// rounds and fails the test after the threads are let go: it never leaves them waiting.
fn race_until_escape(round: &mut usize) -> bool {
    let a = small();
    let block = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // Both sides meet twice a round: the block is published, then all frees are done.
    let barrier = Barrier::new(THREADS + 1);
    let results: Mutex<Vec<Result<Result<(), Error>, String>>> = Mutex::new(Vec::new());
    let (mut escaped, mut failure) = (false, None);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                barrier.wait();
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let p = block.load(Ordering::Relaxed) as *mut u8;
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| a.free(p))).map_err(|e| panic_text(&*e));
                results.lock().unwrap().push(r);
                barrier.wait();
            });
        }
        while *round < ROUNDS && !escaped && failure.is_none() {
            let pages = SIZES[*round % SIZES.len()];
            // Another live block beside it, so that the freed one is not always merged at once.
            let keep = a.alloc(4096, 4096, Flags::NONE).unwrap();
            let p = a.alloc(pages * 4096, 4096, Flags::NONE).unwrap().as_ptr();
            block.store(p as usize, Ordering::Relaxed);
            barrier.wait();
            barrier.wait();
            let rs = std::mem::take(&mut *results.lock().unwrap());
            match check_round(&a, &rs, p, *round, pages) {
                Ok(ok) => escaped = ok > 1,
                Err(e) => failure = Some(e),
            }
            a.free(keep.as_ptr()).unwrap();
            if failure.is_none() && !escaped && round.is_multiple_of(10) {
                failure = a.check_invariants().err().map(|e| format!("round {round}, {pages} pages: {e}"));
            }
            *round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        barrier.wait();
    });
    if let Some(f) = failure {
        panic!("{f}");
    }
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

/// The frees of one round: each a success or a double free, at least one success, and a free
/// after them a double free. The successes, or what failed.
fn check_round(a: &fallow::Allocator, rs: &[Result<Result<(), Error>, String>], p: *mut u8, round: usize, pages: usize) -> Result<usize, String> {
    let double = Err(Error::DoubleFree { addr: p as usize });
    if rs.len() != THREADS {
        return Err(format!("round {round}: {} results", rs.len()));
    }
    let mut ok = 0;
    for r in rs {
        match r {
            Err(panic) => return Err(format!("round {round}, {pages} pages: a free panicked: {panic} (all: {rs:?})")),
            Ok(Ok(())) => ok += 1,
            Ok(r) if *r == double => {}
            Ok(r) => return Err(format!("round {round}, {pages} pages: {r:?}")),
        }
    }
    if ok == 0 {
        return Err(format!("round {round}, {pages} pages: no free of a live block succeeded: {rs:?}"));
    }
    match a.free(p) {
        r if r == double => Ok(ok),
        r => Err(format!("round {round}: free after the race: {r:?}")),
    }
}

/// The message of a caught panic.
fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

//! Multi-threaded stress: threads allocate, write a pattern, verify it and free, with and without
//! ZERO, sharing one allocator.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use fallow::{Allocator, Config, Flags};

fn run(a: Allocator, threads: usize, iters: usize) {
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut rng = 0x9e3779b97f4a7c15u64 ^ (t as u64 * 7919);
                let mut held: Vec<(usize, usize, u8)> = Vec::new();
                for i in 0..iters {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let pages = match rng % 10 {
                        0 => 64 + (rng >> 8) as usize % 512,
                        1..=3 => 4 + (rng >> 8) as usize % 60,
                        _ => 1 + (rng >> 8) as usize % 4,
                    };
                    let zero = rng & (1 << 40) != 0;
                    let flags = if zero { Flags::ZERO } else { Flags::NONE };
                    let len = pages * 4096;
                    let p = a.alloc(len, 4096, flags).unwrap().as_ptr() as usize;
                    if zero {
                        // SAFETY: `p` is a live block of `len` bytes just allocated, which only this thread holds.
                        assert!(unsafe { all_zero(p as *const u8, len) }, "ZERO block {p:#x} holds data");
                    }
                    let v = (t * 31 + i) as u8 | 1;
                    // SAFETY: `p` is that live block of `len` bytes, not yet freed.
                    unsafe { std::ptr::write_bytes(p as *mut u8, v, len) };
                    held.push((p, len, v));
                    if held.len() > 8 || rng & 1 == 0 {
                        let k = (rng >> 20) as usize % held.len();
                        let (p, len, v) = held.swap_remove(k);
                        // SAFETY: every entry of `held` is a live block of `len` bytes this thread allocated and has not freed.
                        assert!(unsafe { all_eq(p as *const u8, len, v) }, "block {p:#x} was overwritten");
                        a.free(p as *mut u8).unwrap();
                    }
                }
                for (p, len, v) in held {
                    // SAFETY: as above: a live block of `len` bytes held by this thread, freed only below.
                    assert!(unsafe { all_eq(p as *const u8, len, v) });
                    a.free(p as *mut u8).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = a.stats();
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.alloc_calls, s.free_calls);
    a.check_invariants().unwrap();
    // SAFETY: every thread that allocated from `a` has been joined above.
    unsafe { check_free_states(&a) }.unwrap();
}

#[test]
fn four_threads_small_arena() {
    run(small(), 4, 3000);
}

#[test]
fn two_threads_default_config() {
    run(Allocator::new(Config::default()).unwrap(), 2, 2000);
}

//! Multi-threaded stress: threads allocate, write a pattern, verify it and free, with and without
//! ZERO, sharing one allocator.

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
                        assert!(all_zero(p as *const u8, len), "ZERO block {p:#x} holds data");
                    }
                    let v = (t * 31 + i) as u8 | 1;
                    unsafe { std::ptr::write_bytes(p as *mut u8, v, len) };
                    held.push((p, len, v));
                    if held.len() > 8 || rng & 1 == 0 {
                        let k = (rng >> 20) as usize % held.len();
                        let (p, len, v) = held.swap_remove(k);
                        assert!(all_eq(p as *const u8, len, v), "block {p:#x} was overwritten");
                        a.free(p as *mut u8).unwrap();
                    }
                }
                for (p, len, v) in held {
                    assert!(all_eq(p as *const u8, len, v));
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
    check_free_states(&a).unwrap();
}

#[test]
fn four_threads_small_arena() {
    run(small(), 4, 3000);
}

#[test]
fn two_threads_default_config() {
    run(Allocator::new(Config::default()).unwrap(), 2, 2000);
}

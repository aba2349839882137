//! Which block should a `ZERO` request take when both are free: a dirty block the program has
//! just freed (hot in the CPU cache; costs a memset) or a block the zeroing worker zeroed earlier
//! (no memset; cold, since the worker's non-temporal stores bypass the cache)? Measures, per size,
//! a `ZERO` allocation followed by the program writing the whole block once (the hot reuse loop:
//! `calloc`, `memset`, `free`) in both cases, medians of interleaved repetitions, and prints the
//! ratio. A rule that took the hot block first for requests up to a sixteenth of the last-level
//! cache came from this (docs/design.md, "Reuse-aware zeroing", point 3; the best fit now comes
//! first, zeroed pages breaking ties). In the cold case the hot block, just written, stays
//! live, so that the zeroed block is the only resident one the request can take; the worker is
//! switched off once it has zeroed it, so that nothing runs beside the timed part.
//!
//! ```text
//! cargo run --release -p fallow --example calloc_choice [-- REPS]
//! ```

use std::time::{Duration, Instant};

use fallow::{Allocator, Config, Flags, Tunables};

const PAGE: usize = 4096;

fn allocator(zeroing: bool) -> Allocator {
    let tunables = Tunables { report: false, zeroing, zero_delay_ms: 0, zero_order: 0, ..Tunables::default() };
    Allocator::new(Config { arena_size: 1 << 30, tunables, cache: false, ..Config::default() }).unwrap()
}

fn write(p: *mut u8, len: usize, v: u8) {
    // SAFETY: every caller passes a live block that `a.alloc` just gave for `len` bytes (not yet
    // freed), so `p` is writable for `len` bytes; this safe helper is local to this example.
    unsafe { core::ptr::write_bytes(p, v, len) };
}

/// One measurement of a `ZERO` request for `len` bytes, right after a block of that size was
/// written: that block is freed just before (hot), or, with `cold_zeroed`, kept and the request
/// finds a block the worker zeroed earlier.
fn once(len: usize, cold_zeroed: bool) -> Duration {
    let a = allocator(cold_zeroed);
    let hot = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    if cold_zeroed {
        // Demand for zeroed memory, then a block for the worker to zero.
        let z = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap().as_ptr();
        a.free(z).unwrap();
        let cold = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
        write(cold, len, 0xaa);
        a.free(cold).unwrap();
        let t0 = Instant::now();
        while (a.stats().free_zeroed_pages as usize) * PAGE < len {
            assert!(t0.elapsed() < Duration::from_secs(180), "the worker did not zero the block: {}", a.stats());
            std::thread::sleep(Duration::from_millis(2));
        }
        a.set_tunables(Tunables { zeroing: false, ..a.tunables() }).unwrap();
    }
    write(hot, len, 0x55);
    if !cold_zeroed {
        a.free(hot).unwrap();
    }
    let t0 = Instant::now();
    let p = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    write(p, len, 7);
    let dt = t0.elapsed();
    assert_eq!(p == hot, !cold_zeroed, "the request did not get the block this case measures");
    a.free(p).unwrap();
    if cold_zeroed {
        a.free(hot).unwrap();
    }
    dt
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

/// A hot dirty block plus a memset against a cold zeroed block, for `ZERO` requests by size.
#[derive(clap::Parser)]
struct Args {
    /// Repetitions per size (the median is reported).
    #[arg(default_value_t = 15)]
    reps: usize,
}

fn main() {
    let reps = <Args as clap::Parser>::parse().reps;
    println!("ZERO request + one write of the whole block, median of {reps} (us)");
    println!("{:>9}  {:>14}  {:>14}  {:>6}", "size", "hot dirty+memset", "cold zeroed", "ratio");
    for kib in [256usize, 512, 1024, 2048, 4096, 8192, 16384, 65536] {
        let len = kib << 10;
        let (mut hot, mut cold) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            hot.push(once(len, false));
            cold.push(once(len, true));
        }
        let (h, c) = (median(hot), median(cold));
        println!("{:>6} KiB  {:>14.1}  {:>14.1}  {:>6.2}", kib, h, c, c / h);
    }
}

//! The per-thread caches above 2 MiB: blocks of 4 and 8 MiB (orders 10 and 11), one of each per
//! thread beyond the high mark. A block freed and asked for again is a hit (with slack for a
//! size that is not a power of two of pages), a second free of it is still caught, a `ZERO`
//! request of one reads zero, a thread keeps one block per order, and the heap takes the
//! thread's own cache back before it grows. Workers off and 4 KiB pages: nothing but these calls
//! changes the lists.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::{check_free_states, take_written};
use fallow::{Allocator, Config, Error, Flags, Tunables};

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

fn allocator(arena: usize) -> Allocator {
    let c = Config { arena_size: arena, max_order: 12, thp: false, tunables: Tunables::off(), cache_max_order: 11, ..Config::default() };
    Allocator::new(c).unwrap()
}

fn check(a: &Allocator) {
    a.check_invariants().unwrap();
    // SAFETY: `a` is used by this thread only.
    unsafe { check_free_states(a) }.unwrap();
}

#[test]
fn a_large_block_freed_and_asked_for_again_is_a_hit() {
    let a = allocator(64 * MIB);
    // 4 MiB blocks (with slack, then exact), then 8 MiB ones, plain and ZERO requests.
    let sizes = [3 * MIB, 2 * MIB + PAGE, 4 * MIB, 3 * MIB + 5 * PAGE, 7 * MIB, 8 * MIB, 5 * MIB + PAGE, 6 * MIB];
    let mut last = [None; 2];
    for (i, &len) in sizes.iter().enumerate() {
        let before = a.stats();
        let p = take_written(&a, len, i % 3 == 2, i as u8 + 1);
        let slot = usize::from(len > 4 * MIB);
        if let Some(q) = last[slot] {
            assert_eq!(p, q, "request {i} of {len} bytes did not get the block its order's cache held");
            assert_eq!(a.stats().cache_refills, before.cache_refills, "request {i}: a refill instead of a hit");
        }
        check(&a);
        a.free(p).unwrap();
        last[slot] = Some(p);
        check(&a);
    }
    let s = a.stats();
    // The 4 MiB block went back to the lists at the first 8 MiB request's refill (a refill of a
    // large order gives the smaller large blocks back first, cache/batch.rs).
    assert_eq!(s.cached_pages, 2048, "one 8 MiB block: {s}");
    assert_eq!(s.bytes_in_use, 0);
    assert!(matches!(a.free(last[1].unwrap()), Err(Error::DoubleFree { .. })), "a second free of a cached block was not caught");
    a.drain_thread_cache();
    assert_eq!(a.stats().cached_pages, 0);
    check(&a);
}

#[test]
fn a_thread_keeps_one_block_of_each_large_order() {
    let a = allocator(64 * MIB);
    // Exact 4 MiB blocks: no slack, so the slack bound (one live block with slack per CPU or
    // thread) does not send any of the three to the locked path.
    let blocks: Vec<_> = (0..3).map(|_| take_written(&a, 4 * MIB, false, 1)).collect();
    for &p in &blocks {
        a.free(p).unwrap();
        check(&a);
    }
    let s = a.stats();
    assert_eq!(s.cached_pages, 1024, "{s}");
    // The block cached is the one freed last: the next request gets it.
    assert_eq!(take_written(&a, 4 * MIB, false, 2), blocks[2]);
    check(&a);
}

#[test]
fn a_zero_request_of_a_cached_block_reads_zero_slack_included() {
    let a = allocator(64 * MIB);
    // Written whole, freed (cached, dirty), then asked for with ZERO: a memset of the live part.
    let p = take_written(&a, 4 * MIB, false, 0xff);
    a.free(p).unwrap();
    let q = take_written(&a, 3 * MIB, true, 0xee);
    assert_eq!(q, p);
    a.free(q).unwrap();
    // Its slack was written by the first use: the whole block asked for again reads zero.
    assert_eq!(take_written(&a, 4 * MIB, true, 1), p);
    check(&a);
}

#[test]
fn the_heap_takes_back_the_threads_own_cache_before_it_grows() {
    // One arena of 16 MiB: the 8 MiB block freed into the cache is half of it, and a 16 MiB
    // request can only be served by merging it back.
    let a = allocator(16 * MIB);
    let p = take_written(&a, 8 * MIB, false, 3);
    a.free(p).unwrap();
    assert_eq!(a.stats().cached_pages, 2048);
    let whole = take_written(&a, 16 * MIB, true, 4);
    let s = a.stats();
    assert_eq!((s.arenas, s.cached_pages), (1, 0), "the heap grew instead of draining the cache: {s}");
    a.free(whole).unwrap();
    check(&a);
}

#[test]
fn small_blocks_keep_to_the_high_mark_and_leave_the_large_ones_alone() {
    let a = allocator(64 * MIB);
    let big = take_written(&a, 8 * MIB, false, 1);
    let mid = take_written(&a, 4 * MIB, false, 2);
    // 64 blocks of 128 KiB (8 MiB), more than the 4 MiB high mark: their frees drain the stacked
    // orders down to half of it, never the large blocks.
    let small: Vec<_> = (0..64).map(|i| take_written(&a, 128 << 10, false, i as u8)).collect();
    a.free(big).unwrap();
    a.free(mid).unwrap();
    for p in small {
        a.free(p).unwrap();
        let s = a.stats();
        assert!(s.cached_pages <= 1024 + 1024 + 2048, "{s}");
    }
    check(&a);
    assert_eq!(take_written(&a, 8 * MIB, false, 3), big, "the 8 MiB block was drained by small frees");
    assert_eq!(take_written(&a, 4 * MIB, false, 4), mid, "the 4 MiB block was drained by small frees");
    check(&a);
}

#[test]
fn a_large_block_left_in_an_idle_threads_cache_is_zeroed_for_the_next_zero_request() {
    // The zeroing worker on, reporting off (nothing else drains caches); 4 KiB pages.
    let t = Tunables { report: false, zeroing: true, zeroed_reserve: 64 * MIB, ..Tunables::default() };
    let c = Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: t, cache_max_order: 11, ..Config::default() };
    let a = Allocator::new(c).unwrap();
    // Demand for zeroed memory, then a 4 MiB block written and freed into this thread's cache,
    // and the thread stays out of the allocator (reading the statistics is not a call).
    let z = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap();
    a.free(z.as_ptr()).unwrap();
    let p = take_written(&a, 4 * MIB, false, 0x5a);
    a.free(p).unwrap();
    assert!(a.stats().cached_pages >= 1024);
    common::wait_for("the cached block given back and zeroed", || {
        let s = a.stats();
        s.cached_pages < 1024 && s.zeroed_background_bytes >= (4 * MIB) as u64
    });
    // Only the large block went: the small blocks the ZERO request left cached stay.
    let before = a.stats();
    assert!(before.cached_pages > 0, "the zeroing worker drained the small blocks too: {before}");
    take_written(&a, 4 * MIB, true, 1);
    let s = a.stats();
    assert_eq!(s.zeroed_on_alloc_bytes, before.zeroed_on_alloc_bytes, "the ZERO request paid a memset: {s}");
    assert!(s.cache_remote_drains > 0, "{s}");
    a.check_invariants().unwrap();
}

/// A refill of a large order gives back only the cache's smaller large blocks (the pieces of
/// the block it wants): a loop of 4 and 8 MiB requests with smaller frees between them, which
/// move the hot block, keeps one block of each order and refills neither.
#[test]
fn a_refill_of_a_large_order_leaves_a_larger_cached_block_alone() {
    let a = allocator(64 * MIB);
    let round = |byte: u8| {
        for (i, len) in [4 * MIB, 256 << 10, 8 * MIB, 256 << 10].into_iter().enumerate() {
            let p = take_written(&a, len, false, byte + i as u8);
            a.free(p).unwrap();
        }
    };
    // Three rounds to settle (the first 8 MiB refill gives the 4 MiB block back; then each
    // order refills once from the lists).
    for r in 0..3 {
        round(1 + 4 * r);
    }
    let before = a.stats();
    for r in 0..10 {
        round(20 + 4 * r);
    }
    let after = a.stats();
    assert_eq!(after.cache_refills, before.cache_refills, "the loop refilled: {after}");
    assert_eq!(after.cached_pages, 1024 + 2048 + 64, "a 4 MiB, an 8 MiB and a 256 KiB block: {after}");
    check(&a);
}

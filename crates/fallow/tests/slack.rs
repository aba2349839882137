//! Slack: a request of a cached order that is not a power of two of pages is served whole from
//! a per-thread cache (65..127 pages get a block of 128), its pages past the request kept in
//! their free states until the block is freed. These tests check the states, the counters and
//! the validation on every path a block with slack can take: back into the cache, the locked
//! path, `free_reported`, `resize_in_place`, a double free and pointers into the slack.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fallow::{Allocator, Config, Error, Flags, PageState, Tunables};

const PAGE: usize = 4096;

/// Workers off (exact states and counters); 2 MiB blocks cached (cache_max_order 9).
/// On 4 KiB pages: the slack keeps each page's state (with huge pages, a unit handed out in part
/// is `Zeroed` whole: buddy/units.rs, tested in tests/huge_units.rs).
fn cfg() -> Config {
    Config { arena_size: 64 << 20, max_order: 12, thp: false, tunables: Tunables::off(), cache_high_pages: 2048, ..Config::default() }
}

fn check(a: &Allocator) {
    a.check_invariants().unwrap();
    // SAFETY: every caller in this file holds `a` on one thread at the call (the one other thread, in
    // `blocks_with_slack_freed_by_another_thread`, is joined before its last `check`).
    unsafe { check_free_states(a) }.unwrap();
    let s = a.stats();
    assert_eq!(s.free_pages() * PAGE as u64 + s.bytes_in_use + s.slack_bytes + s.isolated_pages * PAGE as u64, s.reserved_bytes, "{s}");
}

fn all_returned(a: &Allocator) {
    a.drain_thread_cache();
    check(a);
    let s = a.stats();
    assert_eq!((s.bytes_in_use, s.slack_bytes, s.live_blocks, s.cached_pages), (0, 0, 0, 0), "{s}");
}

#[test]
fn a_block_with_slack_is_served_and_taken_back_by_the_cache() {
    let a = Allocator::new(cfg()).unwrap();
    // Warm the cache with one 128-page block, then reuse it for sizes in (64, 128] pages.
    let p = a.alloc(128 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    let hits0 = a.stats().cache_hits;
    for pages in [96usize, 65, 127, 100, 128, 70] {
        let q = a.alloc(pages * PAGE - 100, PAGE, Flags::NONE).unwrap().as_ptr();
        assert_eq!(q, p, "{pages} pages: the cached block");
        assert_eq!(a.usable_size(q), Some(pages * PAGE));
        let s = a.stats();
        assert_eq!(s.bytes_in_use, (pages * PAGE) as u64);
        assert_eq!(s.slack_bytes, ((128 - pages) * PAGE) as u64, "{s}");
        // SAFETY: `q` is a live block of `pages * PAGE` usable bytes (asserted above), not yet freed.
        unsafe { std::ptr::write_bytes(q, 0x5a, pages * PAGE) };
        check(&a);
        a.free_sized(q, pages * PAGE - 100).unwrap();
        check(&a);
    }
    let s = a.stats();
    assert_eq!(s.cache_hits - hits0, 12, "every allocation and free a cache hit: {s}");
    all_returned(&a);
}

#[test]
fn zeroed_requests_get_zeros_and_the_slack_keeps_its_states() {
    let a = Allocator::new(cfg()).unwrap();
    // From a fresh block (every page reported: reads zero), 80 of its 128 pages, written.
    let q = a.alloc(80 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(a.stats().slack_bytes, (48 * PAGE) as u64);
    // SAFETY: `q` is a live block of 80 pages from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(q, 0xee, 80 * PAGE) };
    a.free(q).unwrap();
    check(&a);
    // Back in the cache: 80 dirty pages, 48 still reported. A ZERO request of 100 pages must
    // read zero everywhere, and a memset covers the 80 dirty pages only.
    let before = a.stats();
    let z = a.alloc(100 * PAGE, PAGE, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(z, q);
    // SAFETY: `z` is a live block of 100 pages from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(z, 100 * PAGE) });
    let after = a.stats();
    assert_eq!(after.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes, (80 * PAGE) as u64, "{after}");
    assert_eq!(after.zero_skipped_bytes - before.zero_skipped_bytes, (20 * PAGE) as u64, "{after}");
    // The slack (pages 100..128) is still reported: freed, it is listed so.
    a.free(z).unwrap();
    a.drain_thread_cache();
    let (lo, hi) = (z as usize + 100 * PAGE, z as usize + 128 * PAGE);
    let dirty_end = a.free_runs().iter().find(|r| r.0 == z as usize).map(|r| (r.0 + r.1, r.2));
    assert_eq!(dirty_end, Some((lo, PageState::Dirty)));
    let slack = a.free_runs().into_iter().find(|r| r.0 == lo).map(|r| (r.1 >= hi - lo, r.2));
    assert_eq!(slack, Some((true, PageState::Reported)));
    all_returned(&a);
}

#[test]
fn the_locked_paths_give_the_slack_back() {
    let a = Allocator::new(cfg()).unwrap();
    let warm = a.alloc(256 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    a.free(warm).unwrap();
    // free_reported: the live pages become reported, the slack goes back as it was.
    let q = a.alloc(200 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(a.stats().slack_bytes, (56 * PAGE) as u64);
    // SAFETY: `q` is a live block of 200 pages from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(q, 1, 200 * PAGE) };
    // SAFETY: `[q, q + 200 pages)` is that live block, mapped, and nothing else lives in it.
    assert_eq!(unsafe { libc::madvise(q as *mut libc::c_void, 200 * PAGE, libc::MADV_DONTNEED) }, 0);
    // SAFETY: the block's pages were just given back with MADV_DONTNEED, so they read zero.
    unsafe { a.free_reported(q) }.unwrap();
    check(&a);
    assert_eq!(a.stats().slack_bytes, 0);
    // resize_in_place, shrinking and growing: the block becomes exact first.
    let r = a.alloc(150 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `r` is a live block of 150 pages from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(r, 2, 150 * PAGE) };
    assert!(a.stats().slack_bytes > 0);
    assert!(a.resize_in_place(r, 140 * PAGE).unwrap());
    assert_eq!((a.usable_size(r), a.stats().slack_bytes), (Some(140 * PAGE), 0));
    check(&a);
    assert!(a.resize_in_place(r, 250 * PAGE).unwrap());
    assert_eq!(a.usable_size(r), Some(250 * PAGE));
    // SAFETY: `r` is live with 250 usable pages (asserted above), used by this thread only.
    assert!(unsafe { all_eq(r, 140 * PAGE, 2) });
    check(&a);
    a.free(r).unwrap();
    all_returned(&a);
}

#[test]
fn bad_frees_of_blocks_with_slack_are_caught() {
    let a = Allocator::new(cfg()).unwrap();
    let warm = a.alloc(128 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    a.free(warm).unwrap();
    let q = a.alloc(90 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    // Inside the allocation: an interior pointer; in the slack: not an allocation at all.
    assert!(matches!(a.free(q.wrapping_add(10 * PAGE)), Err(Error::InteriorPointer { .. })));
    assert!(matches!(a.free(q.wrapping_add(100 * PAGE)), Err(Error::InvalidPointer { .. })));
    // A sized free with the block's size rather than the request's is refused.
    assert!(a.free_sized(q, 128 * PAGE).is_err());
    a.free(q).unwrap();
    assert!(matches!(a.free(q), Err(Error::DoubleFree { .. })));
    check(&a);
    all_returned(&a);
}

#[test]
fn blocks_with_slack_freed_by_another_thread() {
    let a = Allocator::new(cfg()).unwrap();
    let mut blocks = Vec::new();
    for i in 0..40usize {
        let pages = 65 + (i * 37) % 63;
        let p = a.alloc(pages * PAGE, PAGE, if i % 3 == 0 { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr();
        if i % 3 == 0 {
            // SAFETY: `p` is a live block of `pages * PAGE` bytes just allocated, used by this thread only.
            assert!(unsafe { all_zero(p, pages * PAGE) });
        }
        // SAFETY: `p` is that live block of `pages * PAGE` bytes, not yet freed.
        unsafe { std::ptr::write_bytes(p, i as u8, pages * PAGE) };
        blocks.push((p as usize, pages, i as u8));
    }
    check(&a);
    let b = a.clone();
    std::thread::spawn(move || {
        for (p, pages, v) in blocks {
            // SAFETY: each entry of `blocks` is a live block of `pages * PAGE` bytes, moved to this thread, which
            // alone uses it until it frees it below.
            assert!(unsafe { all_eq(p as *const u8, pages * PAGE, v) });
            b.free(p as *mut u8).unwrap();
        }
        b.check_invariants().unwrap();
    })
    .join()
    .unwrap();
    all_returned(&a);
}

#[test]
fn a_pointer_into_the_slack_is_not_a_double_free() {
    let a = Allocator::new(cfg()).unwrap();
    // Blocks of 4 pages freed (records with FREED_START all over), then the pages taken again as
    // one block of 65 pages and its slack.
    let v: Vec<*mut u8> = (0..32).map(|_| a.alloc(4 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr()).collect();
    for p in &v {
        a.free(*p).unwrap();
    }
    a.drain_thread_cache();
    let q = a.alloc(65 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    let r = a.free(q.wrapping_add(68 * PAGE));
    assert!(matches!(r, Err(Error::InvalidPointer { .. })), "{r:?}");
    a.free(q).unwrap();
    all_returned(&a);
}

#[test]
fn stats_read_during_slack_frees_never_wrap() {
    let a = Allocator::new(cfg()).unwrap();
    let pairs = Arc::new(AtomicU64::new(0));
    let (b, n) = (a.clone(), pairs.clone());
    // The other thread's counters move while this one reads them: its pairs, not a timing, bound
    // the test.
    const PAIRS: u64 = 2_000_000;
    let t = std::thread::spawn(move || {
        while n.load(Ordering::Relaxed) < PAIRS {
            let p = b.alloc(65 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
            b.free(p).unwrap();
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    while pairs.load(Ordering::Relaxed) < PAIRS {
        let s = a.stats();
        assert!(s.bytes_in_use <= s.reserved_bytes && s.slack_bytes <= s.reserved_bytes && s.live_blocks <= 1, "{s}");
    }
    t.join().unwrap();
    all_returned(&a);
}

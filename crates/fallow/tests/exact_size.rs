//! Blocks at their real size (buddy/span.rs): a request that no aligned resident block holds is
//! taken from a run of adjacent free blocks beside a resident one, unaligned, before memory the
//! kernel must fault in. A model test (random sizes, frees in random order: no overlap, contents
//! kept, the lists' invariants and every page's state checked at every step, and everything
//! merged back at the end; caches and huge pages off, then on), and the cases that show the run
//! being used. Workers off: nothing but these calls changes the lists.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use fallow::{Allocator, Config, Flags, Tunables};
use proptest::prelude::*;

const PAGE: usize = 4096;

fn allocator() -> Allocator {
    let c = Config { arena_size: 64 << 20, max_order: 12, thp: false, tunables: Tunables::off(), cache: false, ..Config::default() };
    Allocator::new(c).unwrap()
}

/// Allocate `len` bytes aligned to `align` with `flags`, checking that the request faulted no
/// memory in (no reported or never-used page reused) and that the invariants hold after it.
fn alloc_resident(a: &Allocator, len: usize, align: usize, flags: Flags) -> *mut u8 {
    let before = a.stats().reused_reported_bytes;
    let p = a.alloc(len, align, flags).unwrap().as_ptr();
    assert_eq!(a.stats().reused_reported_bytes, before, "the request of {len} bytes faulted reported or never-used memory in");
    a.check_invariants().unwrap();
    p
}

/// Free `blocks` one by one, the invariants checked after each, and check that everything
/// merged back into whole blocks of order 12.
fn free_all_merged(a: &Allocator, blocks: &[*mut u8]) {
    for &q in blocks {
        a.free(q).unwrap();
        a.check_invariants().unwrap();
    }
    assert!(merged_to_top(&a.stats(), 12), "the blocks did not merge back: {:?}", a.stats().free_blocks);
}

/// `n` blocks of `pages` pages each, written (block `i` with `i + 1`), checked to lie side by
/// side in the order taken (a fresh arena is carved in order).
fn side_by_side(a: &Allocator, n: u8, pages: usize) -> Vec<*mut u8> {
    let blocks: Vec<*mut u8> = (0..n).map(|i| take_written(a, pages * PAGE, false, i + 1)).collect();
    for w in blocks.windows(2) {
        assert_eq!(w[1] as usize - w[0] as usize, pages * PAGE, "the fresh arena was not carved in order");
    }
    blocks
}

#[test]
fn a_request_fits_an_unaligned_run_of_resident_pages_instead_of_fresh_memory() {
    let a = allocator();
    // Four 64 KiB blocks side by side at the start of a fresh arena, written (dirty).
    let blocks = side_by_side(&a, 4, 16);
    // Free the middle two: 32 dirty pages that no aligned 32-page block holds (pages 16..48).
    a.free(blocks[1]).unwrap();
    a.free(blocks[2]).unwrap();
    a.check_invariants().unwrap();
    // 24 pages (order 5): no aligned resident block of order 5 is free.
    let p = alloc_resident(&a, 24 * PAGE, 8, Flags::NONE);
    let run = blocks[1] as usize..=blocks[1] as usize + 8 * PAGE;
    assert!(run.contains(&(p as usize)), "the request was not placed in the run of resident pages");
    // SAFETY: `check_invariants` passed; no other thread uses `a`.
    unsafe { check_free_states(&a) }.unwrap();
    // The rest of the run (8 pages) is free and dirty, and all of it merges back.
    free_all_merged(&a, &[p, blocks[0], blocks[3]]);
}

#[test]
fn a_run_reaches_back_through_smaller_blocks_to_hold_a_request() {
    let a = allocator();
    // 12, 4, 16 and 16 pages side by side at the start of a fresh arena, written (dirty).
    let sizes = [12usize, 4, 16, 16];
    let blocks: Vec<*mut u8> = sizes.iter().enumerate().map(|(i, &n)| take_written(&a, n * PAGE, false, i as u8 + 1)).collect();
    for (i, w) in blocks.windows(2).enumerate() {
        assert_eq!(w[1] as usize - w[0] as usize, sizes[i] * PAGE, "the fresh arena was not carved in order");
    }
    // Free the second and third: a run of 20 dirty pages (12..32) made of a 4-page block and,
    // after it, a 16-page one, the only block a request of 20 pages (order 5) seeds a run from.
    a.free(blocks[1]).unwrap();
    a.free(blocks[2]).unwrap();
    a.check_invariants().unwrap();
    // Only the run measured back from its seed through the 4-page block (its tail mark) holds it.
    let p = alloc_resident(&a, 20 * PAGE, 8, Flags::NONE);
    assert_eq!(p, blocks[1], "the request was not placed on the run of resident pages before its seed");
    free_all_merged(&a, &[p, blocks[0], blocks[3]]);
}

/// A request that no run of resident pages holds goes right after the arena's used part (as
/// glibc's top chunk grows), not to the next aligned block of its order: that left a gap of
/// never-used pages before each such block, which the runs of later frees around it then
/// faulted in (a program replacing 800 blocks of 256 KiB-1 MiB at random held 27% more than
/// glibc). Blocks of 32 MiB and more (`BIG_ORDER`) stay aligned to their order.
#[test]
fn a_request_no_resident_run_holds_goes_right_after_the_used_part() {
    let a = allocator();
    let first = take_written(&a, 16 * PAGE, false, 1);
    // 24 pages (order 5): the aligned block of order 5 would start at page 32.
    let second = take_written(&a, 24 * PAGE, false, 2);
    assert_eq!(second as usize - first as usize, 16 * PAGE, "not right after the used part");
    let third = take_written(&a, 5 * PAGE, false, 3);
    assert_eq!(third as usize - second as usize, 24 * PAGE, "not right after the used part");
    a.check_invariants().unwrap();
    // SAFETY: `check_invariants` passed; no other thread uses `a`.
    unsafe { check_free_states(&a) }.unwrap();
    free_all_merged(&a, &[first, second, third]);
    // Below 32 MiB, a block of the workers' orders too (600 pages, order 10) goes right after
    // the used part; 32 MiB or more: aligned to its order (64 MiB here), past the used part.
    let c = Config { arena_size: 256 << 20, max_order: 15, thp: false, tunables: Tunables::off(), cache: false, ..Config::default() };
    let a = Allocator::new(c).unwrap();
    let first = take_written(&a, 16 * PAGE, false, 1);
    let mid = a.alloc(600 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(mid as usize - first as usize, 16 * PAGE, "a block below 32 MiB not right after the used part");
    let big = a.alloc(10_000 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(big as usize - first as usize, 16_384 * PAGE, "a big block not aligned to its order");
    a.check_invariants().unwrap();
    for q in [big, mid, first] {
        a.free(q).unwrap();
    }
    assert!(merged_to_top(&a.stats(), 15), "the blocks did not merge back: {:?}", a.stats().free_blocks);
}

#[test]
fn an_aligned_request_in_a_run_keeps_its_alignment() {
    let a = allocator();
    let blocks = side_by_side(&a, 4, 16);
    a.free(blocks[1]).unwrap();
    a.free(blocks[2]).unwrap();
    // 20 pages aligned to 32 KiB (8 pages): pages 16..36 of the run qualify.
    let p = alloc_resident(&a, 20 * PAGE, 8 * PAGE, Flags::ZERO);
    assert_eq!(p as usize % (8 * PAGE), 0);
    let run = blocks[1] as usize..=blocks[1] as usize + 12 * PAGE;
    assert!(run.contains(&(p as usize)), "the request was not placed in the run of resident pages");
    // SAFETY: `p` is a live block of 20 pages that only this thread uses.
    assert!(unsafe { all_zero(p, 20 * PAGE) }, "a ZERO request from dirty pages was not zeroed");
    for q in [p, blocks[0], blocks[3]] {
        a.free(q).unwrap();
    }
    a.check_invariants().unwrap();
    assert!(merged_to_top(&a.stats(), 12));
}

#[test]
fn a_zeroed_request_without_zeroed_pages_takes_the_best_run_not_a_larger_aligned_block() {
    let a = allocator();
    // Eight 64 KiB blocks side by side (pages 0..128), written (dirty).
    let blocks = side_by_side(&a, 8, 16);
    // A run of 32 dirty pages that no aligned 32-page block holds (pages 16..48), and an aligned
    // dirty block of 64 pages (pages 64..128), both just freed.
    for i in [1, 2, 4, 5, 6, 7] {
        a.free(blocks[i]).unwrap();
    }
    assert_eq!(a.stats().free_zeroed_pages, 0);
    // 24 pages, zeroed: the run fits it best. Taking the aligned block first (a first fit by
    // order) would split the 64-page block and leave the run as it was.
    let p = a.alloc(24 * PAGE, 8, Flags::ZERO).unwrap().as_ptr();
    let run = blocks[1] as usize..=blocks[1] as usize + 8 * PAGE;
    assert!(run.contains(&(p as usize)), "the request split the larger aligned block instead of taking the run");
    // SAFETY: `p` is a live block of 24 pages that only this thread uses.
    assert!(unsafe { all_zero(p, 24 * PAGE) }, "a ZERO request from dirty pages was not zeroed");
    a.check_invariants().unwrap();
    free_all_merged(&a, &[p, blocks[0], blocks[3]]);
}

/// An allocator whose reporter gives back every free block of 64 KiB or more at once (and
/// nothing else runs): `set_tunables(..calm())` stops it giving back more.
fn reporting_allocator(cache: bool) -> Allocator {
    let t = Tunables { report: true, report_delay_ms: 0, report_order: 4, ..Tunables::off() };
    let c = Config { arena_size: 64 << 20, max_order: 12, thp: false, tunables: t, cache, ..Config::default() };
    Allocator::new(c).unwrap()
}

/// The reporter's tunables, with a delay no test outlives.
fn calm(a: &Allocator) -> Tunables {
    Tunables { report_delay_ms: 3_600_000, ..a.tunables() }
}

/// The last block freed is left unmerged (buddy/deferred.rs) until a pass of the reporter finds it
/// left alone for `zero_delay`. A free wakes only an idle reporter; one that naps (blocks too
/// young for the delay) looks again after a tenth of the delay, which `calm` makes six minutes:
/// wake it, so that its next pass comes at once (`set_tunables` kicks the workers).
fn kick_reporter(a: &Allocator) {
    a.set_tunables(a.tunables()).unwrap();
}

/// Wait until the reporter has given back at least `pages` pages.
fn wait_reported(a: &Allocator, pages: usize) {
    wait_for("the reporter to give the freed blocks back", || a.stats().reported_bytes as usize >= pages * PAGE);
}

#[test]
fn a_run_covers_the_resident_part_of_a_free_block_merged_with_reported_memory() {
    let a = reporting_allocator(false);
    // Five 256 KiB blocks side by side (pages 0..320), written.
    let blocks = side_by_side(&a, 5, 64);
    // Pages 0..128 freed and given back; then pages 128..320 freed dirty.
    a.free(blocks[0]).unwrap();
    a.free(blocks[1]).unwrap();
    wait_reported(&a, 128);
    a.set_tunables(calm(&a)).unwrap();
    for &q in &blocks[2..] {
        a.free(q).unwrap();
    }
    // The last block freed is left unmerged until the reporter's next pass merges it: then the
    // arena is one free block, the only seed, its first 128 pages reported.
    kick_reporter(&a);
    wait_for("everything to merge", || merged_to_top(&a.stats(), 12) && a.stats().free_blocks[0][12] == 1);
    a.check_invariants().unwrap();
    // 48 pages: placed at that block's start, where the run around it starts too, they would
    // fault reported pages in; its part that suits them best starts at page 128.
    let p = alloc_resident(&a, 48 * PAGE, 8, Flags::NONE);
    assert_eq!(p, blocks[2], "the request was not placed on the first resident pages");
    // SAFETY: `check_invariants` passed; no other thread uses `a`.
    unsafe { check_free_states(&a) }.unwrap();
    a.free(p).unwrap();
    assert!(merged_to_top(&a.stats(), 12));
}

#[test]
fn a_split_keeps_the_resident_half_before_the_one_with_more_preferred_pages() {
    // Reporter and zeroing worker on, each in turn (nothing else runs).
    let t = Tunables { report: true, report_delay_ms: 0, report_order: 4, zeroing: false, zero_order: 4, ..Tunables::off() };
    let c = Config { arena_size: 64 << 20, max_order: 12, thp: false, tunables: t, cache: false, ..Config::default() };
    let a = Allocator::new(c).unwrap();
    // Pages 0..64 as four blocks of 16, pages 64..128 as one of 64, a live guard at 128..256.
    let mut blocks = side_by_side(&a, 4, 16);
    blocks.push(take_written(&a, 64 * PAGE, false, 5));
    let guard = take_written(&a, 128 * PAGE, false, 6);
    assert_eq!(guard as usize - blocks[0] as usize, 128 * PAGE, "the fresh arena was not carved in order");
    // Pages 0..16 given back; pages 64..128 zeroed by the worker; pages 16..64 freed dirty.
    a.free(blocks[0]).unwrap();
    wait_reported(&a, 16);
    a.set_tunables(Tunables { zeroing: true, ..calm(&a) }).unwrap();
    let z = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap();
    a.free(z.as_ptr()).unwrap();
    a.free(blocks[4]).unwrap();
    wait_for("the 64-page block to be zeroed", || a.stats().free_zeroed_pages >= 64);
    a.set_tunables(Tunables { zeroing: false, ..a.tunables() }).unwrap();
    for &q in &blocks[1..4] {
        a.free(q).unwrap();
    }
    // One free block of pages 0..128 once the reporter merged the last block freed: 16 reported
    // and 48 dirty pages below, 64 zeroed above.
    kick_reporter(&a);
    wait_for("pages 0..128 to merge", || a.stats().free_blocks[0][7] == 1);
    a.check_invariants().unwrap();
    // 64 pages, plain: the lower half holds more dirty pages (what a plain request prefers) but
    // would fault 16 pages in; the upper half is all resident.
    let p = alloc_resident(&a, 64 * PAGE, 8, Flags::NONE);
    assert_eq!(p, blocks[4], "the request was not placed on the resident half");
    a.free(p).unwrap();
    a.free(guard).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_cache_refill_leaves_a_mostly_reported_block_for_a_run_of_resident_pages() {
    let a = reporting_allocator(true);
    // Five 256 KiB blocks side by side (pages 0..320), written; every request below is a power
    // of two of pages of a cached order, so it goes through the thread's cache.
    let blocks = side_by_side(&a, 5, 64);
    a.set_tunables(calm(&a)).unwrap();
    // A run of 128 dirty pages that no aligned 128-page block holds (pages 64..192), and a block
    // of 256 pages (256..512) listed `Dirty` for its first 64 pages, the rest never used.
    for i in [1, 2, 4] {
        a.free(blocks[i]).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    // 128 pages: splitting the 256-page block would keep its half with the dirty pages, half of
    // which were never used.
    let p = alloc_resident(&a, 128 * PAGE, 4096, Flags::NONE);
    assert_eq!(p, blocks[1], "the request was not placed on the run of resident pages");
    for q in [p, blocks[0], blocks[3]] {
        a.free(q).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert!(merged_to_top(&a.stats(), 12), "the blocks did not merge back: {:?}", a.stats().free_blocks);
}

/// An allocator with the per-thread caches on (their defaults: 8 MiB blocks and smaller) and
/// nothing else running.
fn caching_allocator() -> Allocator {
    let c = Config { arena_size: 64 << 20, max_order: 12, thp: false, tunables: Tunables::off(), cache: true, ..Config::default() };
    Allocator::new(c).unwrap()
}

#[test]
fn a_request_above_the_caches_takes_the_threads_cached_blocks_before_fresh_memory() {
    let a = caching_allocator();
    // An 8 MiB block and a 4 MiB one side by side, written, then freed into this thread's cache
    // (one block of each of its large orders).
    let big = take_written(&a, 8 << 20, false, 1);
    let next = take_written(&a, 4 << 20, false, 2);
    assert_eq!(next as usize - big as usize, 8 << 20, "the fresh arena was not carved in order");
    a.free(big).unwrap();
    a.free(next).unwrap();
    assert_eq!(a.stats().cached_pages, 3 << 10, "the blocks were not cached");
    // 9 MiB, above the caches: no listed memory is resident, but the cache holds more than
    // the request, side by side.
    takes_the_cached_memory(&a, 9 << 20, big);
}

/// A request of `len` bytes is placed at `at` (memory this thread's cache held) without
/// faulting memory in; then everything merges back.
fn takes_the_cached_memory(a: &Allocator, len: usize, at: *mut u8) {
    let p = alloc_resident(a, len, 4096, Flags::NONE);
    assert_eq!(p, at, "the request was not placed on the cache's blocks, given back");
    a.free(p).unwrap();
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert!(merged_to_top(&a.stats(), 12), "the blocks did not merge back: {:?}", a.stats().free_blocks);
}

#[test]
fn a_cache_refill_takes_the_threads_other_cached_blocks_before_fresh_memory() {
    let a = caching_allocator();
    // Four 256 KiB blocks side by side (pages 0..256), written, then freed into this thread's
    // cache: the only resident memory, none of it listed.
    let blocks = side_by_side(&a, 4, 64);
    for &b in &blocks {
        a.free(b).unwrap();
    }
    assert_eq!(a.stats().cached_pages, 256, "the blocks were not cached");
    // 1 MiB, a cached order the cache holds no block of: its refill gives the other blocks back
    // first, where they merge into the block it takes.
    takes_the_cached_memory(&a, 1 << 20, blocks[0]);
}

#[test]
fn slack_that_is_not_all_dirty_comes_back_with_its_counts() {
    let a = caching_allocator();
    // 64 dirty pages at the start of a fresh arena, merged back with the never-used pages
    // beside them.
    let p = take_written(&a, 64 * PAGE, false, 1);
    a.free(p).unwrap();
    a.drain_thread_cache();
    // 150 pages (order 8) from the only resident memory: the 256-page block, mixed, whose slack
    // (pages 150..256) was never used. Freed, the block comes back into the cache whole, and
    // its entry must count the slack's pages as they are (`check_invariants` compares them with
    // the state bytes).
    let q = take_written(&a, 150 * PAGE, false, 2);
    assert_eq!(q, p, "the request did not take the block of resident pages");
    assert_eq!(a.stats().slack_bytes, 106 * PAGE as u64, "the request was not served with slack");
    a.check_invariants().unwrap();
    a.free(q).unwrap();
    assert_eq!(a.stats().cached_pages, 256, "the block did not come back into the cache");
    a.check_invariants().unwrap();
    // Served again whole (a power of two of pages), it reads as written where it was written.
    let r = take_written(&a, 256 * PAGE, true, 3);
    assert_eq!(r, p);
    a.free(r).unwrap();
    a.drain_thread_cache();
    a.check_invariants().unwrap();
}

/// A live block of the model: `len` bytes at `addr`, every byte `fill`.
struct Live {
    addr: usize,
    len: usize,
    fill: u8,
}

/// One case of the model: `ops` on `a`, checked at every step, everything merged back at the end.
fn run_model(a: &Allocator, ops: Vec<(usize, bool, u16, bool)>) -> Result<(), TestCaseError> {
    let mut live: Vec<Live> = Vec::new();
    let mut fill = 1u8;
    for (pages, zero, pick, free) in ops {
        if free && !live.is_empty() {
            let l = live.swap_remove(pick as usize % live.len());
            // SAFETY: `l` is a live block of `l.len` bytes that only this thread uses.
            prop_assert!(unsafe { all_eq(l.addr as *const u8, l.len, l.fill) }, "a block's contents changed");
            a.free(l.addr as *mut u8).unwrap();
        } else {
            let len = pages * PAGE - (pick as usize % PAGE);
            let flags = if zero { Flags::ZERO } else { Flags::NONE };
            let p = a.alloc(len, 8, flags).unwrap().as_ptr();
            let addr = p as usize;
            prop_assert_eq!(a.usable_size(p).unwrap(), pages * PAGE, "a block holds more than its pages");
            prop_assert!(!live.iter().any(|l| addr < l.addr + l.len && l.addr < addr + len), "blocks overlap");
            if zero {
                // SAFETY: `p` is a live block of at least `len` bytes that only this thread uses.
                prop_assert!(unsafe { all_zero(p, len) }, "a ZERO request got garbage");
            }
            // SAFETY: as just above.
            unsafe { p.write_bytes(fill, len) };
            live.push(Live { addr, len, fill });
            fill = fill.wrapping_add(1).max(1);
        }
        a.check_invariants().unwrap();
        // SAFETY: `check_invariants` passed; no other thread uses `a`.
        unsafe { check_free_states(a) }.map_err(TestCaseError::fail)?;
    }
    for l in live.drain(..) {
        a.free(l.addr as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    prop_assert!(merged_to_top(&s, 12), "tails did not merge back: {:?}", s.free_blocks);
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<(usize, bool, u16, bool)>> {
    prop::collection::vec((1usize..1500, any::<bool>(), any::<u16>(), any::<bool>()), 1..100)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    #[test]
    fn exact_size_blocks_model(ops in ops()) {
        run_model(&allocator(), ops)?;
    }

    /// The same with the caches and huge pages on: slack, the hot blocks and the slack bound
    /// beside the runs, and every take settling the huge-page units it touches.
    #[test]
    fn exact_size_blocks_model_with_caches_and_huge_pages(ops in ops()) {
        let c = Config { arena_size: 64 << 20, max_order: 12, thp: true, tunables: Tunables::off(), ..Config::default() };
        run_model(&Allocator::new(c).unwrap(), ops)?;
    }
}

/// A run that reaches the unwritten top-level blocks (`buddy/tops.rs`: a fresh arena writes the
/// record of one at a time) goes on through them as through any free block: a request finds the
/// dirty pages at the end of the used part rather than going past them to fresh memory.
#[test]
fn a_run_reaching_the_unwritten_top_level_blocks_is_as_long_as_before() {
    // 1 MiB top-level blocks, the caches off.
    let t = Tunables { report: true, report_delay_ms: 0, report_order: 4, ..Tunables::off() };
    let a = Allocator::new(Config { arena_size: 8 << 20, max_order: 8, thp: false, tunables: t, cache: false, ..Config::default() }).unwrap();
    // A whole top-level block, freed and given back: it stays on the reported list, so the next
    // takes do not write the next block.
    let first = side_by_side(&a, 1, 256)[0];
    a.free(first).unwrap();
    wait_reported(&a, 256);
    a.set_tunables(calm(&a)).unwrap();
    // 200 pages, then 50 written and freed: the free run at the end of the second block,
    // [456, 512), ends where the unwritten blocks start.
    let _b = side_by_side(&a, 1, 200);
    let c = side_by_side(&a, 1, 50)[0];
    a.free(c).unwrap();
    a.check_invariants().unwrap();
    // 100 pages: on the 50 dirty pages and 50 after them, not past them.
    let d = a.alloc(100 * PAGE, PAGE, Flags::NONE).unwrap().as_ptr();
    assert_eq!(d, c, "the request went past the dirty pages of the run");
    a.check_invariants().unwrap();
}

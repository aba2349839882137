//! The hot block (cache/hot.rs): the block a thread freed last, of 64 KiB or more, serves its
//! next request that takes more than an eighth of it, whatever the request's order, so that a
//! loop of sizes on both sides of a power of two stays in one block. A `ZERO` request served
//! from it reads zero, a request of an eighth of it or less does not take it, nor does a block
//! no longer cached. Workers off and 4 KiB pages: nothing but these calls changes the lists.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::{check_free_states, quiet, take_written};
use fallow::{Allocator, Config, Flags, Tunables};

const PAGE: usize = 4096;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;


fn check(a: &Allocator) {
    a.check_invariants().unwrap();
    // SAFETY: `a` is used by this thread only.
    unsafe { check_free_states(a) }.unwrap();
}

/// Allocate `len` bytes (`zero`: checked to read zero), write them, check, free, check.
fn take_and_free(a: &Allocator, len: usize, zero: bool, byte: u8) -> *mut u8 {
    let p = take_written(a, len, zero, byte);
    check(a);
    a.free(p).unwrap();
    check(a);
    p
}

#[test]
fn the_block_freed_last_serves_a_smaller_order() {
    let a = quiet(64 * MIB);
    // A 2 MiB block (order 9), freed: 1.2 MiB (order 9 with slack) and 0.9 MiB (order 8) get it.
    let p = take_and_free(&a, 2 * MIB, false, 1);
    let q = take_and_free(&a, 1229 * KIB, false, 2);
    assert_eq!(q, p, "1.2 MiB after a 2 MiB block did not get it");
    let r = take_and_free(&a, 922 * KIB, false, 3);
    assert_eq!(r, p, "0.9 MiB after the 2 MiB block did not get it (an order-8 block instead)");
    // Alternating on both sides of 1 MiB, the loop stays in the one block.
    for (i, len) in [700 * KIB, 1300 * KIB, 600 * KIB, 1100 * KIB, 1000 * KIB + 5].into_iter().enumerate() {
        assert_eq!(take_and_free(&a, len, i % 2 == 0, 4 + i as u8), p, "request {i} of {len} bytes left the hot block");
    }
    let s = a.stats();
    assert_eq!((s.bytes_in_use, s.slack_bytes), (0, 0), "{s}");
    // The block came back whole each time: one 2 MiB block cached, nothing else.
    assert_eq!(s.cached_pages, 512, "{s}");
}

#[test]
fn a_zero_request_from_the_hot_block_reads_zero() {
    let a = quiet(64 * MIB);
    // Dirty the whole 4 MiB block, slack included, then ask for a zeroed 2.5 MiB and 1.5 MiB.
    let p = take_and_free(&a, 4 * MIB, false, 0xaa);
    let q = a.alloc(2 * MIB + MIB / 2, PAGE, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(q, p, "the ZERO request did not get the hot block");
    // SAFETY: a live block of 2.5 MiB, this thread's.
    assert!(unsafe { common::all_zero(q, 2 * MIB + MIB / 2) }, "the hot block's live part does not read zero");
    check(&a);
    a.free(q).unwrap();
    let r = a.alloc(MIB + MIB / 2, PAGE, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(r, p);
    // SAFETY: a live block of 1.5 MiB, this thread's.
    assert!(unsafe { common::all_zero(r, MIB + MIB / 2) });
    check(&a);
    a.free(r).unwrap();
    check(&a);
}

#[test]
fn the_hot_block_serves_large_orders() {
    let a = quiet(64 * MIB);
    // 4 MiB (order 10, the largest cached by default: one block beyond the high mark) freed;
    // 1.5 MiB (order 9) takes it with 2.5 MiB of slack (the only live block with slack, within
    // the bound of one per online CPU), and so does 3 MiB and a page (order 10).
    let p = take_and_free(&a, 4 * MIB, false, 1);
    assert_eq!(take_and_free(&a, MIB + MIB / 2, true, 2), p);
    assert_eq!(take_and_free(&a, 3 * MIB + PAGE, false, 3), p);
    assert_eq!(a.stats().cached_pages, 1024);
}

#[test]
fn an_eighth_of_the_block_or_less_does_not_take_it() {
    let a = quiet(64 * MIB);
    let p = take_and_free(&a, 2 * MIB, false, 1);
    // 256 KiB and a page is more than an eighth of 2 MiB: the hot block serves it (a loop of
    // sizes across two powers of two stays in one block).
    assert_eq!(take_and_free(&a, 256 * KIB + PAGE, false, 2), p, "the hot block did not serve more than an eighth of itself");
    // 256 KiB less a page is under an eighth: its own order's block (a refill, which may take
    // the same memory: the cache gives its blocks back before it faults memory in), not the
    // hot one.
    let refills = a.stats().cache_refills;
    let q = take_and_free(&a, 256 * KIB - PAGE, false, 2);
    assert_eq!(a.stats().cache_refills, refills + 1, "the hot block served an eighth of itself or less");
    // And exactly 256 KiB: the block of its order just freed.
    assert_eq!(take_and_free(&a, 256 * KIB, false, 2), q);
    // Nor does a block no longer cached: drained, the hint is passed over (the request refills
    // its own order, which may well split the same memory again).
    take_and_free(&a, 2 * MIB, false, 3);
    a.drain_thread_cache();
    let refills = a.stats().cache_refills;
    let r = take_written(&a, MIB - PAGE, false, 4);
    check(&a);
    assert_eq!(a.stats().cache_refills, refills + 1, "a drained block was served as the hot block");
    a.free(r).unwrap();
    check(&a);
}

#[test]
fn a_hot_block_handed_out_is_not_served_twice() {
    let a = quiet(64 * MIB);
    let p = take_and_free(&a, 2 * MIB, false, 1);
    // Taken again (its own order, the hit path), and while it lives a smaller request gets
    // another block.
    let q = take_written(&a, 2 * MIB, false, 2);
    assert_eq!(q, p);
    let r = take_written(&a, 900 * KIB, false, 3);
    assert_ne!(r, p);
    check(&a);
    a.free(r).unwrap();
    a.free(q).unwrap();
    check(&a);
    // The 2 MiB block was freed last: it is the hot block again.
    assert_eq!(take_and_free(&a, 900 * KIB, false, 4), p);
}

#[test]
fn a_power_of_two_served_from_the_hot_block_comes_back_whole() {
    let a = quiet(64 * MIB);
    let p = take_and_free(&a, 2 * MIB, false, 1);
    // Exactly 1 MiB, a `ZERO` request (the out-of-line path) and a plain one whose own order's
    // stack is empty: 256 pages with 256 of slack, freed by the hit path's caller as any block
    // with slack, not as a block of 256 pages.
    for (zero, byte) in [(true, 2), (false, 3)] {
        let q = take_written(&a, MIB, zero, byte);
        assert_eq!(q, p);
        assert_eq!(a.stats().slack_bytes, MIB as u64);
        check(&a);
        a.free(q).unwrap();
        check(&a);
        let s = a.stats();
        assert_eq!((s.slack_bytes, s.cached_pages, s.bytes_in_use), (0, 512, 0), "{s}");
    }
}

#[test]
fn a_block_from_the_hot_block_freed_elsewhere_or_resized() {
    let a = quiet(64 * MIB);
    let p = take_and_free(&a, 2 * MIB, false, 1);
    // Exactly 1 MiB with slack, freed by another thread (into its own cache, whole).
    let q = take_written(&a, MIB, true, 2) as usize;
    assert_eq!(q as *mut u8, p);
    std::thread::scope(|s| {
        s.spawn(|| {
            a.free(q as *mut u8).unwrap();
            check(&a);
        });
    });
    check(&a);
    let s = a.stats();
    assert_eq!((s.slack_bytes, s.bytes_in_use), (0, 0), "{s}");
    // Served again from this thread's hot block, then resized in place: the slack goes back
    // first, and the block is exact from then on.
    let p = take_and_free(&a, 2 * MIB, false, 3);
    let q = take_written(&a, MIB, false, 4);
    assert_eq!(q, p);
    assert!(a.resize_in_place(q, MIB + 64 * KIB).unwrap());
    check(&a);
    assert!(a.resize_in_place(q, MIB).unwrap());
    check(&a);
    a.free(q).unwrap();
    check(&a);
    let s = a.stats();
    assert_eq!((s.slack_bytes, s.bytes_in_use), (0, 0), "{s}");
}

/// The online CPUs, as the slack bound counts them.
fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize
}

/// An allocator whose high mark is 1 MiB (blocks up to 512 KiB stacked).
fn small_high_mark() -> Allocator {
    let c = Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: Tunables::off(), cache_high_pages: 256, ..Config::default() };
    Allocator::new(c).unwrap()
}

#[test]
fn the_process_holds_at_most_its_bound_of_slack() {
    let a = small_high_mark();
    // 300 KiB requests: a 512 KiB block each with 212 KiB of slack. The bound for one thread is
    // one live block with slack per online CPU (far under the high mark per CPU in pages); past
    // it, the rest are served at their real size.
    let len = 300 * KIB;
    let bound = 212 * KIB * online_cpus();
    let n = 4 * online_cpus() + 8;
    let live: Vec<*mut u8> = (0..n).map(|i| take_written(&a, len, false, i as u8 + 1)).collect();
    let s = a.stats();
    assert_eq!(s.slack_bytes, bound as u64, "not one block with slack per CPU: {s}");
    check(&a);
    for p in live {
        a.free(p).unwrap();
    }
    check(&a);
    assert_eq!(a.stats().slack_bytes, 0);
}

#[test]
fn every_thread_with_a_cache_may_hold_a_block_with_slack() {
    let a = small_high_mark();
    // Twice as many threads as CPUs, each holding one 300 KiB request (a 512 KiB block with 212 KiB of
    // slack) at the same time: each thread's loop keeps its slack, whatever the CPUs, so every
    // one of them gets it (with one per CPU only, the threads past the CPUs took the locked
    // path at every call, in a region of their own).
    let threads = 2 * online_cpus();
    let len = 300 * KIB;
    let s = while_threads_hold(&a, threads, |i| Some(take_written(&a, len, false, i as u8 + 1) as usize), || a.stats());
    assert_eq!(s.slack_bytes, (threads * 212 * KIB) as u64, "a thread's block was served without slack: {s}");
    check(&a);
    assert_eq!(a.stats().slack_bytes, 0);
}

/// Run `work` in `threads` threads at once, each after its first pair (which registers its
/// cache); once every thread holds what `work` returned, `look` runs here, and its result is
/// returned after the threads have freed those blocks and ended (so that a failed check fails
/// the test rather than leaving the threads waiting).
fn while_threads_hold<R>(a: &Allocator, threads: usize, work: impl Fn(usize) -> Option<usize> + Sync, look: impl FnOnce() -> R) -> R {
    let all_hold = std::sync::Barrier::new(threads + 1);
    let all_read = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|t| {
        for i in 0..threads {
            let (all_hold, all_read, work) = (&all_hold, &all_read, &work);
            t.spawn(move || {
                a.free(take_written(a, 16 * PAGE, false, 1)).unwrap();
                let p = work(i);
                all_hold.wait();
                all_read.wait();
                if let Some(p) = p {
                    a.free(p as *mut u8).unwrap();
                }
            });
        }
        all_hold.wait();
        let seen = look();
        all_read.wait();
        seen
    })
}

#[test]
fn idle_threads_raise_the_bound_to_twice_the_cpus_at_most() {
    let a = small_high_mark();
    // Three times as many threads as CPUs have a cache and hold nothing; this thread takes 300
    // KiB requests (212 KiB of slack each): one block with slack per thread with a cache, but at
    // most two per CPU, whatever the idle threads.
    let cpus = online_cpus();
    let s = while_threads_hold(&a, 3 * cpus, |_| None, || {
        let live: Vec<*mut u8> = (0..4 * cpus + 8).map(|i| take_written(&a, 300 * KIB, false, i as u8 + 1)).collect();
        let s = a.stats();
        for p in live {
            a.free(p).unwrap();
        }
        s
    });
    assert_eq!(s.slack_bytes, (2 * cpus * 212 * KIB) as u64, "not two blocks with slack per CPU: {s}");
    check(&a);
}

#[test]
fn the_slack_in_all_stays_under_the_high_mark_per_block_allowed() {
    let cpus = online_cpus();
    let c = Config { arena_size: (16 * cpus + 32) * MIB, max_order: 12, thp: false, tunables: Tunables::off(), ..Config::default() };
    let a = Allocator::new(c).unwrap();
    // Twice as many threads as CPUs (so two blocks with slack per CPU allowed), each freeing an
    // 8 MiB block and then taking 1 MiB and a page from it, the hot block (1,791 pages of slack,
    // more than the high mark of 1,024): the slack in all stays under the high mark per block
    // allowed, so fewer threads than that get it.
    let threads = 2 * cpus;
    let limit = (1024 * PAGE * threads) as u64;
    let s = while_threads_hold(&a, threads, |i| {
        a.free(take_written(&a, 8 * MIB, false, i as u8 + 1)).unwrap();
        Some(take_written(&a, MIB + PAGE, false, i as u8 + 1) as usize)
    }, || a.stats());
    assert!(s.slack_bytes > 0, "no block was served with slack: {s}");
    assert!(s.slack_bytes <= limit, "slack past the high mark per block allowed ({limit}): {s}");
    check(&a);
    assert_eq!(a.stats().slack_bytes, 0);
}

#[test]
fn a_run_the_caches_could_hold_does_not_keep_the_next_request_on_the_locked_path() {
    let a = quiet(64 * MIB);
    // 9 MiB is above the caches: freed on the locked path, the next request goes there too.
    take_and_free(&a, 9 * MIB, false, 1);
    let p = take_written(&a, 3 * MIB, false, 2);
    assert_eq!(a.stats().slack_bytes, 0, "the request after the locked free took the cache");
    check(&a);
    a.free(p).unwrap();
    check(&a);
    // That 3 MiB run, freed on the locked path too, is no locked hot block: a loop of requests
    // the caches hold (3-8 MiB) would otherwise stay on the locked path for good, one run after
    // another. The next 3 MiB is a cached 4 MiB block with slack again.
    let q = take_written(&a, 3 * MIB, false, 3);
    assert_eq!(a.stats().slack_bytes, MIB as u64, "the request after a run the caches could hold took the locked path");
    check(&a);
    a.free(q).unwrap();
    check(&a);
}

#[test]
fn blocks_with_slack_freed_by_another_thread_leave_the_bound_as_it_was() {
    let a = small_high_mark();
    // One live block at a time, each freed by another thread: the slack is given back each
    // time, so every block keeps getting it. There is no other free memory: each next request's
    // block is the last one's, whose slack (pages 75..128) was never touched and still reads as
    // never used, so a refill must judge the block by the request's live pages, all resident.
    let len = 300 * KIB;
    for i in 0..(4 * online_cpus() + 8) {
        let p = take_written(&a, len, false, i as u8 + 1) as usize;
        let s = a.stats();
        assert!(s.slack_bytes > 0, "block {i} was served without slack: {s}");
        std::thread::scope(|t| {
            t.spawn(|| a.free(p as *mut u8).unwrap());
        });
    }
    check(&a);
}

#[test]
fn small_requests_after_a_large_free_stay_in_the_cache() {
    let a = quiet(64 * MIB);
    take_and_free(&a, 5 * MIB, false, 1);
    // 12 KiB requests are not a loop on the 5 MiB block: they take the cache, every call a hit
    // (an allocation and a free).
    let before = a.stats();
    for i in 0..100u8 {
        take_and_free(&a, 3 * PAGE, false, i);
    }
    let after = a.stats();
    assert!(after.cache_hits - before.cache_hits >= 200, "the small requests left the cache: {before} -> {after}");
}

#[test]
fn a_request_the_block_freed_last_on_the_locked_path_could_hold_goes_there() {
    let a = quiet(64 * MIB);
    // 9 MiB is above the caches (8 MiB): freed on the locked path, it is the locked hot block.
    take_and_free(&a, 9 * MIB, false, 1);
    // 3 MiB would be a cached 4 MiB block with 1 MiB of slack; it takes the locked path
    // instead, at its real size.
    let p = take_written(&a, 3 * MIB, false, 2);
    let s = a.stats();
    assert_eq!(s.slack_bytes, 0, "the request was served with slack, from the cache: {s}");
    assert_eq!(a.usable_size(p), Some(3 * MIB));
    check(&a);
    a.free(p).unwrap();
    check(&a);
}

/// A request larger than the caches' largest block, after the thread freed a block of that
/// largest order into its cache: the cached block goes back to the lists first, and the request
/// takes the run that starts where it was (the loop stays in one region), not memory elsewhere.
/// Back and forth across the caches' largest order, the loop keeps to that region.
#[test]
fn a_request_above_the_caches_takes_the_run_of_the_cached_block_freed_last() {
    // The default caches (up to 8 MiB); an arena with room for the run beside the block.
    let c = Config { arena_size: 128 * MIB, max_order: 14, thp: false, tunables: Tunables::off(), ..Config::default() };
    let a = Allocator::new(c).unwrap();
    let p = take_and_free(&a, 8 * MIB, false, 1);
    assert_eq!(a.stats().cached_pages, 2048, "the 8 MiB block was not cached");
    let q = take_and_free(&a, 8 * MIB + 256 * KIB, false, 2);
    assert_eq!(q, p, "8.25 MiB after a cached 8 MiB block went elsewhere");
    for (i, len) in [6 * MIB, 8 * MIB + 100 * KIB, 5 * MIB, 8 * MIB, 8 * MIB + 200 * KIB].into_iter().enumerate() {
        assert_eq!(take_and_free(&a, len, i % 2 == 1, 3 + i as u8), p, "request {i} of {len} bytes left the region");
    }
}

#[test]
fn a_loop_across_the_caches_largest_order_stays_in_one_region() {
    // The default caches (up to 8 MiB), as above: 400 requests of 3-8.25 MiB, each written and
    // freed (xorshift, a fixed seed). Every request overlaps the one before it: the loop never
    // moves to a second region, which it would write in turn with the first.
    let c = Config { arena_size: 128 * MIB, max_order: 14, thp: false, tunables: Tunables::off(), ..Config::default() };
    let a = Allocator::new(c).unwrap();
    let (lo, span) = (3 * MIB as u64, (6 * MIB as u64) * 11 / 8 - 3 * MIB as u64);
    let mut x: u64 = 88172645463325252;
    let mut prev: Option<(usize, usize)> = None;
    for i in 0..400 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (lo + x % span) as usize;
        let p = take_written(&a, len, i % 3 == 0, i as u8) as usize;
        if let Some((q, n)) = prev {
            assert!(p < q + n && q < p + len, "request {i} of {len} bytes at {p:#x} left the region of the one before ({n} bytes at {q:#x})");
        }
        a.free(p as *mut u8).unwrap();
        prev = Some((p, len));
    }
    check(&a);
}

#[test]
fn alloc_from_hot_takes_the_hot_block_or_nothing() {
    let a = quiet(64 * MIB);
    let nothing = |a: &Allocator, len: usize, flags: Flags, why: &str| {
        let before = a.stats();
        assert!(a.alloc_from_hot(len, flags).is_none(), "{why}");
        let after = a.stats();
        assert_eq!((after.cache_refills, after.live_blocks, after.cached_pages), (before.cache_refills, before.live_blocks, before.cached_pages), "{why}: {after}");
    };
    nothing(&a, 200 * KIB, Flags::NONE, "no block freed yet");
    // 300 KiB (order 7, 512 KiB with slack), written whole and freed: the hot block.
    let p = take_and_free(&a, 300 * KIB, false, 0xaa);
    let q = a.alloc_from_hot(200 * KIB, Flags::NONE).expect("200 KiB after the 512 KiB block").as_ptr();
    assert_eq!(q, p);
    assert_eq!(a.stats().live_blocks, 1);
    // SAFETY: a live block of 200 KiB, this thread's.
    unsafe { q.write_bytes(0xbb, 200 * KIB) };
    check(&a);
    nothing(&a, 200 * KIB, Flags::NONE, "the hot block is live");
    a.free(q).unwrap();
    // Of the block's own order, fewer pages: 400 KiB.
    let r = a.alloc_from_hot(400 * KIB, Flags::NONE).expect("400 KiB from the 512 KiB block").as_ptr();
    assert_eq!(r, p);
    a.free(r).unwrap();
    // Zeroed, where the block was written.
    let z = a.alloc_from_hot(150 * KIB + 5, Flags::ZERO).expect("a ZERO request").as_ptr();
    assert_eq!(z, p);
    // SAFETY: a live block of 150 KiB and 5 bytes, this thread's.
    assert!(unsafe { common::all_zero(z, 150 * KIB + 5) }, "the ZERO request's block does not read zero");
    check(&a);
    a.free(z).unwrap();
    // An eighth of the block (64 KiB) or less, and LOCK, are never served here.
    nothing(&a, 64 * KIB, Flags::NONE, "an eighth of the block");
    nothing(&a, 200 * KIB, Flags::LOCK, "LOCK");
    check(&a);
    let s = a.stats();
    assert_eq!((s.bytes_in_use, s.slack_bytes, s.cached_pages), (0, 0, 128), "{s}");
}

#[test]
fn with_small_objects_a_medium_request_takes_the_hot_block() {
    let c = Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: Tunables::off(), small_objects: true, ..Config::default() };
    let a = Allocator::new(c).unwrap();
    // A page block of 80 KiB (above the small objects' largest, 64 KiB), freed: the hot block.
    let small_max = Allocator::SMALL_MAX;
    let p = a.malloc(80 * KIB, 16, Flags::NONE).unwrap().as_ptr();
    a.free_any(p).unwrap();
    let spans = a.stats().small_spans;
    // The largest small object (an object of the slab's last class otherwise) gets that block,
    // a page block, and no span is made; zeroed where asked.
    let q = a.malloc(small_max, 16, Flags::NONE).unwrap().as_ptr();
    assert_eq!(q, p, "a 64 KiB object after an 80 KiB block did not get it");
    // SAFETY: a live block of 64 KiB, this thread's.
    unsafe { q.write_bytes(0x5c, small_max) };
    a.free_any(q).unwrap();
    let z = a.malloc(small_max, 16, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(z, p);
    // SAFETY: a live block of 64 KiB, this thread's.
    assert!(unsafe { common::all_zero(z, small_max) }, "the zeroed request does not read zero");
    assert_eq!(a.usable_size(z), Some(small_max));
    a.free_any(z).unwrap();
    assert_eq!(a.stats().small_spans, spans, "a span was made for a request the hot block held");
    // Below the smallest hot block (64 KiB, which bounds where a request looks): an object of
    // a span (which may well be cut from the same memory).
    let o = a.malloc(60 * KIB, 16, Flags::NONE).unwrap().as_ptr();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.live_blocks), (1, s.small_spans), "{s}");
    a.free_any(o).unwrap();
    a.check_invariants().unwrap();
}

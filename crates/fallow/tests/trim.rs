//! Trims on demand (`Allocator::trim`, the preload's `malloc_trim`): every free resident page
//! goes back at once, whatever its age, but what the caller keeps; blocks in the caches of this
//! thread and of idle threads too; live blocks keep their contents; trimmed memory reads zero
//! for a `ZERO` request; trims in several threads beside allocations keep the lists whole.
//! Workers off (`common::quiet`): nothing but the trim gives memory back.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::{check_free_states, quiet, take_written, Rng};
use fallow::{Allocator, Config, Flags, Tunables};

const PAGE: usize = 4096;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn resident_free(a: &Allocator) -> u64 {
    a.stats().resident_free_bytes()
}

fn check(a: &Allocator) {
    a.check_invariants().unwrap();
    // SAFETY: no other thread allocates from `a` during the check.
    unsafe { check_free_states(a) }.unwrap();
}

/// Free the live blocks of `half_freed`, then check the lists and page states.
fn free_and_check(a: &Allocator, live: Vec<(*mut u8, usize, u8)>) {
    for (p, _, _) in live {
        a.free(p).unwrap();
    }
    check(a);
}

/// Blocks of 4 KiB to 6 MiB, written; every other one freed (some into the thread's cache).
fn half_freed(a: &Allocator) -> Vec<(*mut u8, usize, u8)> {
    let sizes = [4 * KIB, 12 * KIB, 64 * KIB, 200 * KIB, 512 * KIB, MIB, 3 * MIB, 6 * MIB];
    let mut live = Vec::new();
    for round in 0..6 {
        for (i, &len) in sizes.iter().enumerate() {
            let byte = (round * sizes.len() + i) as u8 | 1;
            let p = take_written(a, len, false, byte);
            if (round + i) % 2 == 0 {
                a.free(p).unwrap();
            } else {
                live.push((p, len, byte));
            }
        }
    }
    live
}

#[test]
fn a_trim_gives_back_every_free_resident_page_at_once_and_keeps_the_live_blocks() {
    let a = quiet(64 * MIB);
    let live = half_freed(&a);
    let before = a.stats();
    assert!(before.resident_free_bytes() > 4 * MIB as u64, "nothing free to trim: {before}");
    assert!(before.cached_pages > 0, "the thread's cache held nothing: the test misses its drain");
    let given = a.trim(0);
    let s = a.stats();
    assert_eq!(s.resident_free_bytes(), 0, "free resident memory left after a trim: {s}");
    assert_eq!(s.cached_pages, 0, "the thread's cache was not drained");
    assert!(given >= before.resident_free_bytes(), "{given} bytes given back of {}", before.resident_free_bytes());
    assert_eq!(s.trims, before.trims + 1);
    assert_eq!(s.trimmed_bytes, before.trimmed_bytes + given);
    assert_eq!(s.reported_bytes, before.reported_bytes + given);
    assert_eq!(s.bytes_in_use, before.bytes_in_use);
    for &(p, len, byte) in &live {
        // SAFETY: `p` is a live block of `len` bytes, this thread's.
        assert!(unsafe { common::all_eq(p, len, byte) }, "a live block of {len} bytes lost its contents");
    }
    check(&a);
    // A second trim finds nothing.
    assert_eq!(a.trim(0), 0);
    free_and_check(&a, live);
}

#[test]
fn a_trim_keeps_what_it_is_asked_to_keep_and_trimmed_memory_reads_zero() {
    let a = quiet(64 * MIB);
    let live = half_freed(&a);
    let free = resident_free(&a) + (a.stats().cached_pages * PAGE as u64);
    let keep = 2 * MIB;
    assert!(free > 3 * keep as u64);
    a.trim(keep);
    let left = resident_free(&a);
    assert!(left >= keep as u64, "kept {left} bytes, asked to keep {keep}");
    // (How little more than `keep` is left: `a_trim_leaves_at_least_what_it_keeps...` below.)
    assert!(left < free, "nothing given back: {left} of {free}");
    check(&a);
    a.trim(0);
    assert_eq!(resident_free(&a), 0);
    // Trimmed memory (every free page now) serves a `ZERO` request without a memset.
    let before = a.stats();
    let p = take_written(&a, 2 * MIB, true, 7);
    let s = a.stats();
    assert_eq!(s.zeroed_on_alloc_bytes, before.zeroed_on_alloc_bytes, "a memset of trimmed memory");
    a.free(p).unwrap();
    free_and_check(&a, live);
}

#[test]
fn a_trim_drains_the_caches_of_idle_threads() {
    let a = quiet(64 * MIB);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let a = &a;
    std::thread::scope(|sc| {
        sc.spawn(move || {
            for len in [8 * KIB, 64 * KIB, 256 * KIB, MIB] {
                let p = take_written(a, len, false, 3);
                a.free(p).unwrap();
            }
            held_tx.send(()).unwrap();
            // Idle (not in the allocator) while the other thread trims.
            done_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        assert!(a.stats().cached_pages > 0, "the idle thread's cache held nothing");
        a.trim(0);
        let s = a.stats();
        // Without `membarrier` an idle thread's cache cannot be drained from outside: then the
        // test only checks that the trim left the lists whole.
        if s.cache_remote_drains > 0 {
            assert_eq!(s.cached_pages, 0, "an idle thread's cache kept its blocks: {s}");
            assert_eq!(s.resident_free_bytes(), 0);
        }
        a.check_invariants().unwrap();
        done_tx.send(()).unwrap();
    });
}

/// Three threads allocate and free at random, two of them trimming every 50 steps.
fn trims_beside_allocations(a: &Allocator) {
    std::thread::scope(|sc| {
        for t in 0..3u64 {
            sc.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
                for i in 0..600 {
                    if rng.below(4) == 0 && !live.is_empty() {
                        let (p, len, byte) = live.swap_remove(rng.below(live.len()));
                        // SAFETY: `p` is a live block of `len` bytes, this thread's.
                        assert!(unsafe { common::all_eq(p, len, byte) }, "a live block lost its contents");
                        a.free(p).unwrap();
                    } else {
                        let len = PAGE * (1 + rng.below(300));
                        let byte = (i as u8) | 1;
                        let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
                        // SAFETY: a fresh block of `len` bytes, this thread's.
                        unsafe { core::ptr::write_bytes(p, byte, len) };
                        live.push((p, len, byte));
                    }
                    if i % 50 == 0 && t < 2 {
                        a.trim(if t == 0 { 0 } else { MIB });
                    }
                }
                for (p, _, _) in live {
                    a.free(p).unwrap();
                }
            });
        }
    });
    assert!(a.stats().trims >= 24);
}

#[test]
fn trims_in_several_threads_beside_allocations_keep_the_lists_whole() {
    let a = quiet(64 * MIB);
    trims_beside_allocations(&a);
    check(&a);
}

#[test]
fn trims_beside_the_workers_keep_the_lists_whole_and_the_states_true() {
    // Both workers at work all along: no delay before a block is reported or zeroed.
    let t = Tunables { report_delay_ms: 0, zero_delay_ms: 0, ..Tunables::default() };
    let a = Allocator::new(Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: t, ..Config::default() }).unwrap();
    trims_beside_allocations(&a);
    a.check_invariants().unwrap();
    // SAFETY: no other thread allocates from `a` now; its workers touch only blocks they isolated.
    unsafe { check_free_states(&a) }.unwrap();
}

/// Blocks of `len` bytes, written, every other one freed (the live ones keep the freed ones
/// apart, so none merges). Returns the live ones.
fn freed_apart(a: &Allocator, n: usize, len: usize) -> Vec<*mut u8> {
    let all: Vec<*mut u8> = (0..2 * n).map(|_| take_written(a, len, false, 9)).collect();
    let mut live = Vec::new();
    for (i, p) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            a.free(p).unwrap();
        } else {
            live.push(p);
        }
    }
    live
}

#[test]
fn a_trim_leaves_at_least_what_it_keeps_and_less_than_a_block_more() {
    let a = quiet(64 * MIB);
    let live = freed_apart(&a, 12, 256 * KIB);
    a.drain_thread_cache();
    assert!(resident_free(&a) >= 3 * MIB as u64);
    a.trim(MIB);
    let left = resident_free(&a);
    assert!((MIB as u64..(MIB + 256 * KIB) as u64).contains(&left), "{left} bytes left, asked to keep {MIB}");
    for p in live {
        a.free(p).unwrap();
    }
    check(&a);
}

#[test]
fn a_trim_gives_back_dirty_blocks_before_zeroed_ones() {
    let t = Tunables { report: false, zeroing: true, zero_delay_ms: 0, zeroed_reserve: 64 * MIB, ..Tunables::default() };
    let a = Allocator::new(Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: t, ..Config::default() }).unwrap();
    // A `ZERO` request first: the zeroing worker zeroes for a demand.
    let z = a.alloc(4 * MIB, PAGE, Flags::ZERO).unwrap().as_ptr();
    a.free(z).unwrap();
    let big = take_written(&a, 8 * MIB, false, 1);
    let apart = take_written(&a, 8 * MIB, false, 2);
    a.free(big).unwrap();
    a.drain_thread_cache();
    common::wait_for("the freed 8 MiB block zeroed", || a.stats().free_zeroed_pages * PAGE as u64 >= 8 * MIB as u64);
    a.set_tunables(Tunables { zeroing: false, ..t }).unwrap();
    let live = freed_apart(&a, 8, 256 * KIB);
    a.drain_thread_cache();
    let before = a.stats();
    assert!(before.free_dirty_pages * PAGE as u64 >= 2 * MIB as u64, "{before}");
    a.trim(2 * MIB);
    let s = a.stats();
    assert_eq!(s.free_dirty_pages, 0, "dirty blocks kept while zeroed ones were there to keep: {s}");
    assert!(s.free_zeroed_pages * PAGE as u64 >= 2 * MIB as u64, "the zeroed memory went before the dirty: {s}");
    a.free(apart).unwrap();
    for p in live {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn a_trim_leaves_the_populated_reserve() {
    let t = Tunables { report: false, populated_reserve: 8 * MIB, ..Tunables::default() };
    let a = Allocator::new(Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: t, ..Config::default() }).unwrap();
    let p = take_written(&a, 16 * MIB, false, 5);
    a.free(p).unwrap();
    common::wait_for("the populated reserve made", || a.stats().free_zeroed_pages * PAGE as u64 >= 8 * MIB as u64);
    a.trim(0);
    let s = a.stats();
    // The zeroing worker would fault a reserve given back in again at once.
    assert!(s.free_zeroed_pages * PAGE as u64 >= 8 * MIB as u64, "the trim gave back the populated reserve: {s}");
    assert_eq!(s.free_dirty_pages, 0, "{s}");
}

#[test]
fn a_trim_gives_back_with_dontneed_where_reports_use_madv_free() {
    let t = Tunables { report_mode: fallow::ReportMode::Free, ..Tunables::off() };
    let a = Allocator::new(Config { arena_size: 64 * MIB, max_order: 12, thp: false, tunables: t, ..Config::default() }).unwrap();
    let live = half_freed(&a);
    a.trim(0);
    let s = a.stats();
    // Lazily freed pages would stay resident until the kernel runs short.
    assert_eq!(s.free_lazy_pages, 0, "{s}");
    assert_eq!(s.resident_free_bytes(), 0, "{s}");
    free_and_check(&a, live);
}

//! Growth: threads that find the heap full at the same moment install one arena between them, not
//! one each (`Allocator::grow` re-checks under the lock and gives a surplus reservation back).
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use fallow::{Allocator, Config, Flags, Tunables};
use std::sync::Barrier;

const ARENA: usize = 16 << 20;
const THREADS: usize = 16;

fn full_allocator() -> (Allocator, usize) {
    // Workers off: an allocation that finds nothing free would otherwise wait for isolated blocks.
    let a = Allocator::new(Config { arena_size: ARENA, max_order: 8, thp: false, tunables: Tunables::off(), ..Config::default() }).unwrap();
    let first = a.alloc(ARENA, 4096, Flags::NONE).unwrap().as_ptr() as usize;
    let s = a.stats();
    assert_eq!((s.arenas, s.free_pages()), (1, 0), "the first arena is not exactly full");
    (a, first)
}

/// `THREADS` (16) threads released by one barrier, each allocating 255 pages (a 1 MiB block, one
/// page given back: not a cached size, so every request takes the locked path) from a heap whose
/// first arena is full, so that every one of them asks for more than the heap has free; sixteen
/// such blocks fit in one more 16 MiB arena. Returns the blocks, written.
fn race(a: &Allocator) -> Vec<usize> {
    let barrier = Barrier::new(THREADS);
    let len = 255 * 4096;
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let barrier = &barrier;
                sc.spawn(move || {
                    barrier.wait();
                    let p = a.alloc(len, 4096, Flags::NONE).unwrap().as_ptr();
                    // SAFETY: `p` is a live block of `len` bytes from `alloc` just above, not yet freed.
                    unsafe { core::ptr::write_bytes(p, t as u8 + 1, len) };
                    p as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn threads_that_find_the_heap_full_together_install_one_arena() {
    // The window is the reservation (a few mmaps) between a failed take and the install: the
    // sixteen threads released by one barrier hit it together in most rounds, and a round is
    // cheap. Whatever the interleaving, the heap ends with exactly one new reservation: two
    // arenas, 32 MiB reserved.
    for round in 0..30 {
        let (a, first) = full_allocator();
        let len = 255 * 4096;
        let blocks = race(&a);
        let s = a.stats();
        assert_eq!(s.arenas, 2, "round {round}: {THREADS} threads that found the heap full together left {} arenas, where one more suffices", s.arenas);
        assert_eq!(s.reserved_bytes, 2 * ARENA as u64, "round {round}");
        assert_eq!(s.live_blocks, THREADS as u64 + 1, "round {round}");
        a.check_invariants().unwrap();
        for (t, &p) in blocks.iter().enumerate() {
            // SAFETY: `p` is a live block of `len` bytes from `race` (its threads joined), freed only below.
            assert!(unsafe { all_eq(p as *const u8, len, t as u8 + 1) }, "round {round}: block of thread {t} overwritten");
            a.free(p as *mut u8).unwrap();
        }
        a.free(first as *mut u8).unwrap();
        let s = a.stats();
        assert_eq!((s.bytes_in_use, s.live_blocks), (0, 0));
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_request_the_new_arena_cannot_serve_still_grows() {
    // The re-check must not swallow a growth that is still needed: a request larger than an
    // arena, racing small ones, gets an arena of its own whichever thread installs first (the
    // small requests' 16 MiB arena cannot hold it), so every round ends with three arenas and
    // every request served. Which three depends on the race: the small requests' 16 MiB arena
    // and a 48 MiB one, or, when a small request retries its take in the big request's new
    // 48 MiB arena before the big one does, two 48 MiB arenas (the big request grows again).
    for round in 0..20 {
        let (a, first) = full_allocator();
        let barrier = Barrier::new(4);
        let (smalls, big) = std::thread::scope(|sc| {
            let small: Vec<_> = (0..3)
                .map(|_| {
                    sc.spawn(|| {
                        barrier.wait();
                        a.alloc(255 * 4096, 4096, Flags::NONE).unwrap().as_ptr() as usize
                    })
                })
                .collect();
            let b = sc.spawn(|| {
                barrier.wait();
                a.alloc(3 * ARENA, 4096, Flags::ZERO).unwrap().as_ptr() as usize
            });
            let big = b.join().unwrap();
            (small.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), big)
        });
        // SAFETY: `big` is a live block of `3 * ARENA` bytes, and its allocating thread has been joined.
        assert!(unsafe { all_zero(big as *const u8, 3 * ARENA) }, "round {round}");
        let s = a.stats();
        assert_eq!(s.arenas, 3, "round {round}: {} arenas for three small requests and one of three arenas' size", s.arenas);
        let reserved = s.reserved_bytes / ARENA as u64;
        assert!(reserved == 5 || reserved == 7, "round {round}: {reserved} arenas' worth reserved, not 1 + 1 + 3 or 1 + 3 + 3");
        for p in smalls.into_iter().chain([big, first]) {
            a.free(p as *mut u8).unwrap();
        }
        assert_eq!(a.stats().bytes_in_use, 0);
        a.check_invariants().unwrap();
    }
}

use os::mapped_bytes as vm_size;

#[test]
fn surplus_reservations_are_unmapped() {
    // The racers' surplus arenas are unmapped, not leaked: in a child (no other test maps
    // anything there), the address space after many racing rounds, each allocator dropped, is
    // what it was after the first round (which warmed up the thread stacks glibc keeps for
    // reuse). A leak would be at least one 16 MiB arena per round in which threads raced.
    in_child(|| {
        let round = || {
            let (a, first) = full_allocator();
            for p in race(&a) {
                a.free(p as *mut u8).unwrap();
            }
            a.free(first as *mut u8).unwrap();
        };
        round();
        let before = vm_size();
        for _ in 0..20 {
            round();
        }
        let after = vm_size();
        if after > before + ARENA {
            return Err(format!("address space grew by {} MiB over 20 dropped allocators", (after - before) >> 20));
        }
        Ok(())
    });
}

//! Tests of the locked allocator together with the workers' interface, driven by hand: what an
//! allocation does while a worker holds a block.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::config::{Config, Tunables};
use crate::flags::Flags;
use crate::heap::ZERO_SLOT;
use crate::os::PAGE_SHIFT;
use crate::page::PageState;

use super::Allocator;

const BLOCK: usize = 16 << 20;
/// The order of `BLOCK`, and of the zeroing worker's chunk (2 MiB by default).
const ORDER: u8 = (BLOCK >> PAGE_SHIFT).trailing_zeros() as u8;
fn chunk_order() -> u8 {
    (Tunables::default().zero_chunk >> PAGE_SHIFT).trailing_zeros() as u8
}

fn allocator() -> Allocator {
    // No worker runs: the test plays the zeroing worker's part itself.
    let tunables = Tunables { zeroing: false, report: false, ..Tunables::default() };
    Allocator::new(Config { arena_size: 4 * BLOCK, thp: false, cache: false, tunables, ..Config::default() }).unwrap()
}

/// A resident free block split by the zeroing worker's chunk: a request of its size waits for
/// the chunk and gets that block back, rather than fault in memory never touched.
#[test]
fn a_large_request_waits_for_the_chunk_being_zeroed_rather_than_fault_in_new_memory() {
    let a = allocator();
    let p = a.alloc(BLOCK, 4096, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of BLOCK bytes, ours until the free below.
    unsafe { p.write_bytes(7, BLOCK) };
    a.free(p).unwrap();
    let chunk = {
        let mut h = a.shared.heap.lock();
        let ai = h.arena_index(p as usize).unwrap();
        let pfn = h.arena(ai).pfn(p as usize);
        let chunk = h.isolate_dirty_piece(ZERO_SLOT, ai, pfn, chunk_order());
        assert!(h.zeroing_holds_part_of(ORDER) && !h.has_unreported(ORDER));
        h.arena(ai).addr(chunk.pfn)
    };
    let reused_before = a.stats().reused_reported_bytes;
    std::thread::scope(|s| {
        let waiter = s.spawn(|| a.alloc(BLOCK, 4096, Flags::ZERO).unwrap().as_ptr() as usize);
        // The request waits (up to ~2 ms at a time, 100 us per look) while the chunk is out.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while a.shared.heap.lock().isolation_waiters == 0 {
            assert!(std::time::Instant::now() < deadline, "the request did not wait for the chunk");
            std::thread::yield_now();
        }
        // Zero the chunk and return it, as the worker does.
        // SAFETY: the chunk is isolated (on no list, handed to nobody) until `unisolate`.
        unsafe { (chunk as *mut u8).write_bytes(0, Tunables::default().zero_chunk) };
        a.shared.heap.lock().unisolate(ZERO_SLOT, |st| if st == PageState::Dirty { PageState::Zeroed } else { st });
        let q = waiter.join().unwrap();
        assert_eq!(q, p as usize, "the request took other memory than the block it waited for");
        // SAFETY: `q` is the live block of BLOCK bytes just allocated, ours until the free below.
        let b = unsafe { core::slice::from_raw_parts(q as *const u8, BLOCK) };
        assert!(b.iter().all(|&x| x == 0), "a ZERO request read garbage");
        a.free(q as *mut u8).unwrap();
    });
    assert_eq!(a.stats().reused_reported_bytes, reused_before, "memory was faulted in");
    assert_eq!(a.shared.heap.lock().isolation_waiters, 0);
    a.check_invariants().unwrap();
}

/// A chunk whose buddies are not all free would not give the size asked back: no waiting.
#[test]
fn a_request_the_chunk_cannot_complete_does_not_wait() {
    let a = allocator();
    let p = a.alloc(BLOCK, 4096, Flags::NONE).unwrap().as_ptr();
    a.free(p).unwrap();
    // Take one half back, then hand a chunk of the other half to the "worker".
    let half = a.alloc(BLOCK / 2, BLOCK / 2, Flags::NONE).unwrap().as_ptr();
    let other = if half == p { p as usize + BLOCK / 2 } else { p as usize };
    assert!(half as usize == other ^ (BLOCK / 2), "the half taken is not of the block freed");
    {
        let mut h = a.shared.heap.lock();
        let ai = h.arena_index(other).unwrap();
        let (pfn, _) = h.arena(ai).free_block_containing(h.arena(ai).pfn(other)).unwrap();
        h.isolate_dirty_piece(ZERO_SLOT, ai, pfn, chunk_order());
        assert!(!h.zeroing_holds_part_of(ORDER));
    }
    let q = a.alloc(BLOCK, 4096, Flags::ZERO).unwrap().as_ptr();
    assert_ne!(q, p);
    a.shared.heap.lock().unisolate(ZERO_SLOT, |st| st);
    a.free(q).unwrap();
    a.free(half).unwrap();
    a.check_invariants().unwrap();
}

/// A chunk amid memory given back would merge into a block that is mostly not resident: a
/// request would fault it in anyway, so it does not wait for the chunk.
#[test]
fn a_chunk_amid_reported_memory_is_not_waited_for() {
    let a = allocator();
    let p = a.alloc(BLOCK, 4096, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` was never written, so its pages read zero and are not resident.
    unsafe { a.free_reported(p).unwrap() };
    let mut h = a.shared.heap.lock();
    let ai = h.arena_index(p as usize).unwrap();
    let (pfn, _) = h.arena(ai).free_block_containing(h.arena(ai).pfn(p as usize)).unwrap();
    h.isolate_dirty_piece(ZERO_SLOT, ai, pfn, chunk_order());
    assert!(!h.zeroing_holds_part_of(ORDER), "waits for a chunk of memory that is not resident");
    assert!(!h.zeroing_holds_part_of(chunk_order()), "waits for a chunk that is not resident");
    h.unisolate(ZERO_SLOT, |st| st);
    drop(h);
    a.check_invariants().unwrap();
}

/// The free hit's arena test (`Shared::first_page_of`, one compare of the rotated offset) takes
/// exactly the page addresses of the first arena, as the alignment test and `view_of` together.
#[test]
fn the_free_hits_arena_test_takes_exactly_the_first_arenas_pages() {
    let a = allocator();
    let s = &a.shared;
    let base = s.view(0).base();
    let len = 4 * BLOCK;
    for addr in [base, base + 4096, base + len - 4096, base + 1, base + 4095, base + len, base + len + 4096, base - 4096, base - 1, 0, usize::MAX & !4095, 4096] {
        let page = addr & 4095 == 0 && s.view_of(addr).is_some_and(|(i, _)| i == 0);
        assert_eq!(s.first_page_of(addr).is_some(), page, "{addr:#x} (arena at {base:#x})");
    }
}

/// Every block of every arena lies in the process-wide span (`SPAN_START..SPAN_END`) as soon as
/// it is handed out, a second arena's too: the preload's `free` sends a pointer outside the span
/// to the C library without asking `owns`.
#[test]
fn every_arena_lies_in_the_process_wide_span() {
    use core::sync::atomic::Ordering::Relaxed;
    use crate::heap::{SPAN_END, SPAN_START};
    let tunables = Tunables { zeroing: false, report: false, ..Tunables::default() };
    let config = Config { arena_size: 4 * BLOCK, max_order: ORDER, thp: false, cache: false, tunables, ..Config::default() };
    let a = Allocator::new(config).unwrap();
    // Five blocks of an arena that holds four: the fifth comes from a second arena.
    let blocks: Vec<usize> = (0..5).map(|_| a.alloc(BLOCK, 4096, Flags::NONE).unwrap().as_ptr() as usize).collect();
    let arenas: Vec<usize> = blocks.iter().map(|&p| a.shared.view_of(p).expect("owned").0).collect();
    assert!(arenas.contains(&0) && arenas.iter().any(|&i| i > 0), "arenas {arenas:?}");
    for &p in &blocks {
        assert!(SPAN_START.load(Relaxed) <= p && p + BLOCK <= SPAN_END.load(Relaxed), "{p:#x}");
    }
    for p in blocks {
        a.free(p as *mut u8).unwrap();
    }
}

/// The workers nap before they set themselves up (`Worker::start_after_nap`): an allocator dropped
/// at once has its workers stopped before they set anything up (before the nap, each set itself
/// up first, whatever came next); one that lives on has them set up once the nap is over.
#[test]
fn workers_set_themselves_up_only_after_their_start_nap() {
    let config = || Config { arena_size: 64 << 20, thp: false, ..Config::default() };
    let a = Allocator::new(config()).unwrap();
    let shared = a.shared.clone();
    // The last handle stops the workers and joins them.
    drop(a);
    let setups = |s: &crate::heap::Shared| (s.reporter.setups.load(Relaxed), s.zeroer.setups.load(Relaxed));
    assert_eq!(setups(&shared), (0, 0), "workers stopped during their start nap set themselves up");
    let a = Allocator::new(config()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while setups(&a.shared) != (1, 1) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(setups(&a.shared), (1, 1), "the workers of a living allocator never set themselves up");
}

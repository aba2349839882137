//! Pieces (`PIECE_ORDER` in config.rs): a block placed right after the arena's used part
//! starts and ends at any page, so freed between live neighbours it leaves free blocks below
//! the workers' orders (2 MiB) at its ends. The reporter and the zeroing worker take those
//! too, down to 64 KiB; smaller ones stay until they merge. No timing is asserted: waits are
//! bounded polls for liveness only.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::{os, take_written, wait_for};
use fallow::{Allocator, Config, Flags, MemoryLimit, PageState, Tunables};

const PAGE: usize = 4096;
/// The freed block, in pages: from page 16 it leaves pieces of 16 to 256 pages (all below the
/// workers' orders) and one of 8 pages at its end (below `PIECE_ORDER`).
const FREED: usize = 600;
const TAIL: usize = 8;

/// 16 MiB blocks on 4 KiB pages, no caches (every free goes to the lists) and no memory limit
/// or pressure signal (which would make the reporter hurry past its delay).
fn config(t: Tunables) -> Config {
    let t = Tunables { memory_limit: MemoryLimit::Off, pressure: false, ..t };
    Config { arena_size: 256 << 20, max_order: 12, thp: false, cache: false, tunables: t, ..Config::default() }
}

/// A live block of 16 pages, then `FREED` pages written and freed, then a live block of 16
/// pages, side by side; the freed block's address.
fn freed_between_live(a: &Allocator) -> usize {
    let first = take_written(a, 16 * PAGE, false, 1);
    let mid = take_written(a, FREED * PAGE, false, 2);
    let last = take_written(a, 16 * PAGE, false, 3);
    assert_eq!(mid as usize - first as usize, 16 * PAGE, "not right after the used part");
    assert_eq!(last as usize - mid as usize, FREED * PAGE, "not right after the used part");
    assert_eq!(mid as usize % (64 * PAGE), 16 * PAGE, "the layout this test counts on");
    a.free(mid).unwrap();
    a.check_invariants().unwrap();
    mid as usize
}

/// Bytes of `[lo, lo + len)` whose recorded free state is `state`.
fn bytes_in_state(a: &Allocator, lo: usize, len: usize, state: PageState) -> usize {
    a.free_runs().iter().filter(|r| r.2 == state).map(|&(s, l, _)| (s + l).min(lo + len).saturating_sub(s.max(lo))).sum()
}

#[test]
fn the_reporter_gives_back_the_pieces_a_block_freed_between_live_ones_leaves() {
    let t = Tunables { report: true, report_delay_ms: 50, zeroing: false, ..Tunables::default() };
    let a = Allocator::new(config(t)).unwrap();
    let mid = freed_between_live(&a);
    let pieces = (FREED - TAIL) * PAGE;
    wait_for("the pieces reported", || bytes_in_state(&a, mid, pieces, PageState::Reported) == pieces);
    assert_eq!(os::resident_pages(mid, pieces).unwrap(), 0, "reported pieces still resident");
    let tail = mid + pieces;
    assert_eq!(bytes_in_state(&a, tail, TAIL * PAGE, PageState::Dirty), TAIL * PAGE, "a piece below 64 KiB reported");
    a.check_invariants().unwrap();
}

#[test]
fn the_zeroing_worker_zeroes_the_pieces_a_block_freed_between_live_ones_leaves() {
    let t = Tunables { report: false, zeroing: true, zeroed_reserve: 64 << 20, ..Tunables::default() };
    let a = Allocator::new(config(t)).unwrap();
    // A ZERO request first, so that the worker has seen demand for zeroed memory.
    let z = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap();
    a.free(z.as_ptr()).unwrap();
    let mid = freed_between_live(&a);
    let pieces = (FREED - TAIL) * PAGE;
    wait_for("the pieces zeroed", || bytes_in_state(&a, mid, pieces, PageState::Zeroed) == pieces);
    let tail = mid + pieces;
    assert_eq!(bytes_in_state(&a, tail, TAIL * PAGE, PageState::Dirty), TAIL * PAGE, "a piece below 64 KiB zeroed");
    // SAFETY: the zeroed pieces are free memory of `a`, which is alive; no thread allocates meanwhile.
    assert!(unsafe { std::slice::from_raw_parts(mid as *const u8, pieces) }.iter().all(|&b| b == 0), "zeroed pieces do not read zero");
    a.check_invariants().unwrap();
}
